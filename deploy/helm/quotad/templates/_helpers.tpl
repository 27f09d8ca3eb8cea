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

{{/* The Secret holding the admin token: yours, the chart's generated one, or none ("") with adminToken.generate false. */}}
{{- define "quotad.adminSecret" -}}
{{- if .Values.adminToken.secretName -}}
{{ .Values.adminToken.secretName }}
{{- else if .Values.adminToken.generate -}}
{{ include "quotad.fullname" . }}-admin-token
{{- end -}}
{{- end -}}

{{/* QUOTAD_ALLOWED_HOSTS: the client Service's DNS names, then allowedHosts; "*" alone when allowedHosts says so. */}}
{{- define "quotad.allowedHosts" -}}
{{- if has "*" .Values.allowedHosts -}}
*
{{- else -}}
{{- $name := include "quotad.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $names := list $name (printf "%s.%s" $name $ns) (printf "%s.%s.svc" $name $ns) (printf "%s.%s.svc.%s" $name $ns .Values.clusterDomain) -}}
{{- concat $names .Values.allowedHosts | uniq | join "," -}}
{{- end -}}
{{- end -}}
