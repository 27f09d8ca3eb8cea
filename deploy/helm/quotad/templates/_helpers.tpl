{{/* The objects' name: the release name, or release-quotad when it does not say quotad. */}}
{{- define "quotad.fullname" -}}
{{- if contains "quotad" .Release.Name -}}
{{- .Release.Name | trunc 57 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-quotad" .Release.Name | trunc 57 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "quotad.selectorLabels" -}}
app.kubernetes.io/name: quotad
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "quotad.labels" -}}
{{ include "quotad.selectorLabels" . }}
app.kubernetes.io/part-of: quotad
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The Secret holding the Redis URL: the chart's own when redis.url is set. */}}
{{- define "quotad.redisSecret" -}}
{{- if .Values.redis.url -}}
{{ include "quotad.fullname" . }}-redis
{{- else -}}
{{ required "redis.url or redis.existingSecret is required: quotad nodes share one Redis" .Values.redis.existingSecret }}
{{- end -}}
{{- end -}}

{{/* The Secret holding the gossip key: the chart's own when cluster.key is set. */}}
{{- define "quotad.clusterSecret" -}}
{{- if .Values.cluster.key -}}
{{ include "quotad.fullname" . }}-cluster-key
{{- else -}}
{{ required "cluster.key or cluster.existingSecret is required: quotad encrypts gossip with a shared key (openssl rand -base64 32)" .Values.cluster.existingSecret }}
{{- end -}}
{{- end -}}

{{/* The probes' scheme and kind: TCP under mutual TLS, where the kubelet has no client certificate. */}}
{{- define "quotad.probe" -}}
{{- if .Values.tls.clientCASecretName -}}
tcpSocket:
  port: http
{{- else -}}
httpGet:
  path: {{ .path }}
  port: http
  {{- if .Values.tls.secretName }}
  scheme: HTTPS
  {{- end }}
{{- end -}}
{{- end -}}
