{{/* A role's PodDisruptionBudget: podDisruptionBudget, with the role's own podDisruptionBudget
     over it (a role naming minAvailable or maxUnavailable replaces both).
     Takes (dict "root" $ "component" NAME "role" ROLE-VALUES). */}}
{{- define "epd.podDisruptionBudget" -}}
{{- $budget := deepCopy .root.Values.podDisruptionBudget -}}
{{- $own := default dict .role.podDisruptionBudget -}}
{{- if or (hasKey $own "minAvailable") (hasKey $own "maxUnavailable") -}}
{{- $budget = omit $budget "minAvailable" "maxUnavailable" -}}
{{- end -}}
{{- $budget = merge (deepCopy $own) $budget -}}
{{- if $budget.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "epd.fullname" .root }}-{{ .component }}
  labels:
    {{- include "epd.labels" . | nindent 4 }}
spec:
  {{- if hasKey $budget "minAvailable" }}
  minAvailable: {{ $budget.minAvailable }}
  {{- else }}
  maxUnavailable: {{ $budget.maxUnavailable }}
  {{- end }}
  {{- with $budget.unhealthyPodEvictionPolicy }}
  unhealthyPodEvictionPolicy: {{ . }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "epd.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}
