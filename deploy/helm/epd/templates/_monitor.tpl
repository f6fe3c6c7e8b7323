{{/* A role's ServiceMonitor or PodMonitor (metrics.monitor.kind), scraping the port `metrics`
     of the role's Service or pods; over HTTPS with metrics.monitor.routeTlsConfig for a route
     serving TLS. Takes (dict "root" $ "component" NAME "tls" SECRET-NAME). */}}
{{- define "epd.monitor" -}}
{{- $monitor := .root.Values.metrics.monitor -}}
{{- if and .root.Values.metrics.enabled $monitor.kind }}
{{- $endpoint := dict "port" "metrics" "path" "/metrics" "interval" $monitor.interval "scrapeTimeout" $monitor.scrapeTimeout -}}
{{- if .tls }}
{{- $_ := set $endpoint "scheme" "https" -}}
{{- with $monitor.routeTlsConfig }}{{ $_ := set $endpoint "tlsConfig" . }}{{ end -}}
{{- end }}
---
apiVersion: monitoring.coreos.com/v1
kind: {{ $monitor.kind }}
metadata:
  name: {{ include "epd.fullname" .root }}-{{ .component }}
  labels:
    {{- include "epd.labels" . | nindent 4 }}
    {{- with $monitor.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "epd.selectorLabels" . | nindent 6 }}
  namespaceSelector:
    matchNames: [{{ .root.Release.Namespace | quote }}]
  {{ ternary "endpoints" "podMetricsEndpoints" (eq $monitor.kind "ServiceMonitor") }}:
    - {{- toYaml $endpoint | nindent 6 }}
{{- end }}
{{- end -}}
