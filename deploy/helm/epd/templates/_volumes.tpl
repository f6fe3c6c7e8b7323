{{/* A container's mounts and its pod's volumes. Every role: the scratch emptyDirs (the root
     filesystem is read-only). dataPlane roles: /dev/shm, and the model directory (read-only)
     or the hub cache (writable, HF_HOME). tls: the route's TLS Secret.
     Both take (dict "root" $ "dataPlane" BOOL "tls" SECRET-NAME). */}}
{{- define "epd.volumeMounts" -}}
{{- $values := .root.Values -}}
- {name: tmp, mountPath: {{ $values.scratch.tmp.mountPath }}}
- {name: home, mountPath: {{ $values.scratch.home.mountPath }}}
{{- if .dataPlane }}
- {name: dshm, mountPath: /dev/shm}
{{- if include "epd.fromHub" .root }}
- {name: hub-cache, mountPath: {{ $values.model.hub.cache.mountPath }}}
{{- else }}
- {name: model, mountPath: {{ $values.model.mountPath }}, readOnly: true}
{{- end }}
{{- end }}
{{- if .tls }}
- {name: tls, mountPath: {{ include "epd.tlsMountPath" .root }}, readOnly: true}
{{- end }}
{{- end -}}

{{- define "epd.volumes" -}}
{{- $values := .root.Values -}}
- name: tmp
  emptyDir: {sizeLimit: {{ $values.scratch.tmp.sizeLimit }}}
- name: home
  emptyDir: {sizeLimit: {{ $values.scratch.home.sizeLimit }}}
{{- if .dataPlane }}
{{- if eq $values.sharedMemory.scope "node" }}
- name: dshm
  hostPath: {path: /dev/shm, type: Directory}
{{- else }}
- name: dshm
  emptyDir: {medium: Memory, sizeLimit: {{ $values.sharedMemory.sizeLimit }}}
{{- end }}
{{- if include "epd.fromHub" .root }}
- name: hub-cache
  {{- toYaml (default (dict "emptyDir" (dict "sizeLimit" $values.model.hub.cache.sizeLimit)) $values.model.hub.cache.volume) | nindent 2 }}
{{- else }}
- name: model
  {{- toYaml (default (dict "hostPath" (dict "path" $values.model.hostPath "type" "Directory")) $values.model.volume) | nindent 2 }}
{{- end }}
{{- end }}
{{- if .tls }}
- name: tls
  secret: {secretName: {{ .tls }}}
{{- end }}
{{- end -}}
