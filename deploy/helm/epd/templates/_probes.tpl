{{/* A container's probes. Startup and readiness: the gRPC health service (NOT_SERVING while
     the model loads and from the start of a drain), or HTTPS /health on the `http` port of a
     route serving TLS (Kubernetes' gRPC probes speak plaintext only; that answer does not
     follow a drain: Kubernetes takes a terminating pod out of its Service anyway). Liveness: the metrics port, which answers until the process stops, drain
     included, else a TCP connection to the gRPC port, open until the drain ends: a draining
     pod is never restarted. Takes (dict "root" $ "port" GRPC-PORT "tls" BOOL). */}}
{{- define "epd.probes" -}}
{{- $probes := .root.Values.probes -}}
{{- $scheme := ternary "HTTPS" "HTTP" (not (empty .tls)) -}}
{{- $ready := dict "grpc" (dict "port" .port) -}}
{{- if .tls }}
{{- $ready = dict "httpGet" (dict "path" "/health" "port" "http" "scheme" "HTTPS") -}}
{{- end }}
{{- $alive := dict "tcpSocket" (dict "port" "grpc") -}}
{{- if .root.Values.metrics.enabled }}
{{- $alive = dict "httpGet" (dict "path" "/metrics" "port" "metrics" "scheme" $scheme) -}}
{{- end }}
startupProbe:
  {{- toYaml (merge (deepCopy $ready) $probes.startup) | nindent 2 }}
readinessProbe:
  {{- toYaml (merge (deepCopy $ready) $probes.readiness) | nindent 2 }}
livenessProbe:
  {{- toYaml (merge (deepCopy $alive) $probes.liveness) | nindent 2 }}
{{- end -}}
