{{/* An encoder's autoscaler, when its autoscaling.enabled: a HorizontalPodAutoscaler on the
     external metric epd_scheduler_encoders_needed (served by prometheus-adapter, rule in
     docs/deploy.md) or a KEDA ScaledObject on the same series through a Prometheus query
     (autoscaling.kind). Either makes replicas = the scheduler's count of encoders of the
     encoder's kind (its device type) the arrivals need, within minReplicas..maxReplicas.
     Takes (dict "root" $ "component" NAME "role" ENCODER-VALUES). */}}
{{- define "epd.autoscaler" -}}
{{- $root := .root -}}
{{- $own := default dict .role.autoscaling -}}
{{- if $own.enabled }}
{{- $settings := $root.Values.autoscaling -}}
{{- $device := default "auto" .role.device -}}
{{- if eq $device "auto" }}
{{- fail (printf "encoders: %q scales on its kind's count: name its device (cpu, cuda or xpu), not auto" .role.name) }}
{{- end }}
{{- $kind := first (splitList ":" $device) -}}
{{- $name := printf "%s-%s" (include "epd.fullname" $root) .component -}}
{{- $labels := merge (dict "model" $root.Values.model.id "device" $kind) (deepCopy $settings.metricLabels) -}}
{{- $min := default 1 $own.minReplicas -}}
{{- $max := default 4 $own.maxReplicas -}}
{{- if lt (int $max) (int $min) }}
{{- fail (printf "encoders: %q has autoscaling.maxReplicas %v below minReplicas %v" .role.name $max $min) }}
{{- end }}
---
{{- if eq $settings.kind "keda" }}
{{- $matchers := list -}}
{{- range $key, $value := $labels }}{{ $matchers = append $matchers (printf "%s=%q" $key $value) }}{{ end }}
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {{ $name }}
  labels:
    {{- include "epd.labels" . | nindent 4 }}
spec:
  scaleTargetRef:
    name: {{ $name }}
  minReplicaCount: {{ $min }}
  maxReplicaCount: {{ $max }}
  pollingInterval: {{ $settings.keda.pollingInterval }}
  cooldownPeriod: {{ $settings.keda.cooldownPeriod }}
  {{- with $settings.behavior }}
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        {{- toYaml . | nindent 8 }}
  {{- end }}
  triggers:
    - type: prometheus
      metadata:
        serverAddress: {{ required "autoscaling.keda.serverAddress: the Prometheus KEDA queries" $settings.keda.serverAddress | quote }}
        query: {{ printf "max(epd_scheduler_encoders_needed{%s})" (join "," $matchers) | quote }}
        threshold: "1"
{{- else }}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ $name }}
  labels:
    {{- include "epd.labels" . | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ $name }}
  minReplicas: {{ $min }}
  maxReplicas: {{ $max }}
  metrics:
    - type: External
      external:
        metric:
          name: epd_scheduler_encoders_needed
          selector:
            matchLabels:
              {{- toYaml $labels | nindent 14 }}
        target:
          type: AverageValue
          averageValue: "1"
  {{- with $settings.behavior }}
  behavior:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}
{{- end -}}
