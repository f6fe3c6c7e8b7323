{{/* Name prefix of every object: the release name, with the chart name unless it holds it. */}}
{{- define "epd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Pod labels a role's Service selects; takes (dict "root" $ "component" NAME). */}}
{{- define "epd.selectorLabels" -}}
app.kubernetes.io/name: {{ default .root.Chart.Name .root.Values.nameOverride }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "epd.labels" -}}
{{ include "epd.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{- define "epd.schedulerAddress" -}}
{{ include "epd.fullname" . }}-scheduler:{{ .Values.ports.scheduler }}
{{- end -}}

{{/* Whether prefill workers hand their KV to decode workers (then decode workers run). */}}
{{- define "epd.hasDecode" -}}
{{- if or (eq .Values.prefill.mode "prefill") (and (eq .Values.prefill.mode "encode_prefill") .Values.prefill.kvTransfer) -}}
true
{{- end -}}
{{- end -}}

{{/* Whether the roles load a Hugging Face hub id rather than a directory on model.volume. */}}
{{- define "epd.fromHub" -}}
{{- if eq .Values.model.source "hub" -}}
true
{{- end -}}
{{- end -}}

{{/* The flags naming the model every role but the scheduler loads, as a JSON list:
     --model (a directory, or a hub id with --revision) and --model-id. */}}
{{- define "epd.modelArgs" -}}
{{- $model := .Values.model -}}
{{- if include "epd.fromHub" . -}}
{{- $args := list "--model" $model.hub.repo "--model-id" $model.id -}}
{{- if $model.hub.revision }}{{ $args = concat $args (list "--revision" $model.hub.revision) }}{{ end -}}
{{- toJson $args -}}
{{- else -}}
{{- toJson (list "--model" $model.path "--model-id" $model.id) -}}
{{- end -}}
{{- end -}}

{{/* Where the route's TLS Secret is mounted, and the flags that read it. */}}
{{- define "epd.tlsMountPath" -}}/etc/epd/tls{{- end -}}

{{- define "epd.tlsArgs" -}}
{{- $dir := include "epd.tlsMountPath" . -}}
{{- toJson (list "--tls-cert" (printf "%s/tls.crt" $dir) "--tls-key" (printf "%s/tls.key" $dir)) -}}
{{- end -}}
