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

{{/* A role's Service: headless for workers (the scheduler hands out their pod addresses;
     the Service names each pod for grpcurl and monitoring), ClusterIP otherwise.
     Takes (dict "root" $ "component" NAME "ports" (list (dict "name" "grpc" "port" N)) "headless" BOOL "type" TYPE "annotations" MAP). */}}
{{- define "epd.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "epd.fullname" .root }}-{{ .component }}
  labels:
    {{- include "epd.labels" . | nindent 4 }}
  {{- with .annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- if .headless }}
  clusterIP: None
  {{- else }}
  type: {{ default "ClusterIP" .type }}
  {{- end }}
  selector:
    {{- include "epd.selectorLabels" . | nindent 4 }}
  ports:
    {{- range .ports }}
    - name: {{ .name }}
      port: {{ .port }}
      targetPort: {{ .name }}
      protocol: TCP
      {{- if eq .name "grpc" }}
      appProtocol: grpc
      {{- end }}
    {{- end }}
{{- end -}}

{{/* A role's Deployment. Takes (dict "root" $ "component" NAME "command" SUBCOMMAND
     "role" ROLE-VALUES "args" LIST "port" GRPC-PORT "extraPorts" LIST "worker" BOOL
     "engine" BOOL "dataPlane" BOOL "recreate" BOOL). dataPlane: mounts the model and
     /dev/shm and sets the host id (every role but the scheduler).. */}}
{{- define "epd.deployment" -}}
{{- $root := .root -}}
{{- $v := .role -}}
{{- $gpus := int (default 0 $v.gpus) -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "epd.fullname" $root }}-{{ .component }}
  labels:
    {{- include "epd.labels" . | nindent 4 }}
spec:
  replicas: {{ if hasKey $v "replicas" }}{{ $v.replicas }}{{ else }}1{{ end }}
  {{- if .recreate }}
  strategy:
    type: Recreate
  {{- end }}
  selector:
    matchLabels:
      {{- include "epd.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "epd.labels" . | nindent 8 }}
      annotations:
        checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
        {{- if $root.Values.metrics.enabled }}
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ $root.Values.metrics.port | quote }}
        {{- end }}
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      terminationGracePeriodSeconds: {{ $root.Values.terminationGracePeriodSeconds }}
      {{- if and .dataPlane (eq $root.Values.sharedMemory.scope "node") }}
      hostPID: true
      {{- end }}
      {{- with $root.Values.podSecurityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ .command }}
          image: "{{ $root.Values.image.repository }}:{{ $root.Values.image.tag }}"
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["epd", {{ .command | quote }}]
          args:
            {{- range concat .args (default list $v.extraArgs) }}
            - {{ . | toString | quote }}
            {{- end }}
          envFrom:
            - configMapRef:
                name: {{ include "epd.fullname" $root }}-config
          env:
            - name: EPD_ADVERTISE_HOST
              valueFrom:
                fieldRef: {fieldPath: status.podIP}
            {{- if .dataPlane }}
            - name: EPD_HOST_ID
              valueFrom:
                fieldRef: {fieldPath: {{ if eq $root.Values.sharedMemory.scope "node" }}spec.nodeName{{ else }}metadata.name{{ end }}}
            {{- end }}
            {{- if .worker }}
            - name: EPD_WORKER_ID
              valueFrom:
                fieldRef: {fieldPath: metadata.name}
            {{- end }}
            {{- if .engine }}
            - name: EPD_KV_HOST
              valueFrom:
                fieldRef: {fieldPath: status.podIP}
            {{- end }}
            {{- if $root.Values.auth.existingSecret }}
            - name: EPD_AUTH_TOKEN
              valueFrom:
                secretKeyRef: {name: {{ $root.Values.auth.existingSecret }}, key: token}
            {{- end }}
            {{- with $v.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - {name: grpc, containerPort: {{ .port }}, protocol: TCP}
            {{- range .extraPorts }}
            - {name: {{ .name }}, containerPort: {{ .port }}, protocol: TCP}
            {{- end }}
            {{- if $root.Values.metrics.enabled }}
            - {name: metrics, containerPort: {{ $root.Values.metrics.port }}, protocol: TCP}
            {{- end }}
          startupProbe:
            grpc: {port: {{ .port }}}
            {{- toYaml $root.Values.probes.startup | nindent 12 }}
          readinessProbe:
            grpc: {port: {{ .port }}}
            {{- toYaml $root.Values.probes.readiness | nindent 12 }}
          livenessProbe:
            grpc: {port: {{ .port }}}
            {{- toYaml $root.Values.probes.liveness | nindent 12 }}
          {{- $resources := deepCopy (default dict $v.resources) }}
          {{- if gt $gpus 0 }}
          {{- $gpu := dict $root.Values.gpuResource $gpus }}
          {{- $_ := set $resources "requests" (merge (deepCopy $gpu) (default dict $resources.requests)) }}
          {{- $_ := set $resources "limits" (merge (deepCopy $gpu) (default dict $resources.limits)) }}
          {{- end }}
          {{- with $resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $root.Values.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- if .dataPlane }}
          volumeMounts:
            - {name: dshm, mountPath: /dev/shm}
            - {name: model, mountPath: {{ $root.Values.model.mountPath }}, readOnly: true}
      volumes:
        {{- if eq $root.Values.sharedMemory.scope "node" }}
        - name: dshm
          hostPath: {path: /dev/shm, type: Directory}
        {{- else }}
        - name: dshm
          emptyDir: {medium: Memory, sizeLimit: {{ $root.Values.sharedMemory.sizeLimit }}}
        {{- end }}
        - name: model
          {{- toYaml $root.Values.model.volume | nindent 10 }}
          {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}
