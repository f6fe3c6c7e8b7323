{{/* A role's Service: headless for workers (the scheduler hands out their pod addresses;
     the Service names each pod for grpcurl and monitoring), ClusterIP otherwise. Every
     Service has the port `metrics` when metrics are on.
     Takes (dict "root" $ "component" NAME "ports" (list (dict "name" "grpc" "port" N)) "headless" BOOL "type" TYPE "annotations" MAP). */}}
{{- define "epd.service" -}}
{{- $ports := .ports -}}
{{- if .root.Values.metrics.enabled -}}
{{- $ports = append $ports (dict "name" "metrics" "port" .root.Values.metrics.port) -}}
{{- end -}}
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
    {{- range $ports }}
    - name: {{ .name }}
      port: {{ .port }}
      targetPort: {{ .name }}
      protocol: TCP
      {{- if eq .name "grpc" }}
      appProtocol: grpc
      {{- end }}
    {{- end }}
{{- end -}}
