{{/* A role's Deployment. Takes (dict "root" $ "component" NAME "command" SUBCOMMAND
     "role" ROLE-VALUES "args" LIST "port" GRPC-PORT "extraPorts" LIST "worker" BOOL
     "engine" BOOL "dataPlane" BOOL "recreate" BOOL "tls" SECRET-NAME). dataPlane: loads the
     model, mounts /dev/shm and sets the host id (every role but the scheduler). tls: the
     Secret the server's TLS certificate and key come from (the route's route.tls). A role
     with autoscaling.enabled leaves replicas to its autoscaler (_autoscaler.tpl). */}}
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
  {{- if not (dig "autoscaling" "enabled" false $v) }}
  replicas: {{ if hasKey $v "replicas" }}{{ $v.replicas }}{{ else }}1{{ end }}
  {{- end }}
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
        {{- if .tls }}
        prometheus.io/scheme: https
        {{- end }}
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
            {{- include "epd.env" . | nindent 12 }}
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
          {{- include "epd.probes" (dict "root" $root "port" .port "tls" .tls) | nindent 10 }}
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
          volumeMounts:
            {{- include "epd.volumeMounts" . | nindent 12 }}
      volumes:
        {{- include "epd.volumes" . | nindent 8 }}
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

{{/* A container's own environment (beside the ConfigMap): its pod's address, host id and
     worker id from the downward API, the auth token and the hub token from their Secrets, the
     hub cache. Takes the context of epd.deployment. */}}
{{- define "epd.env" -}}
{{- $root := .root -}}
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
{{- if and .dataPlane (include "epd.fromHub" $root) }}
- name: HF_HOME
  value: {{ $root.Values.model.hub.cache.mountPath | quote }}
{{- with $root.Values.model.hub.tokenSecret }}
{{- if .name }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ .name }}, key: {{ .key }}}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
