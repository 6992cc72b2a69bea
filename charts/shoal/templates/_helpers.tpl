{{/* Full name of the release's objects, at most 63 characters, starting with
a letter: helm takes a release name that starts with a digit, a Service's name
must not, so the chart's name comes first then. */}}
{{- define "shoal.fullname" -}}
{{- if regexMatch "^[0-9]" .Release.Name -}}
{{- printf "%s-%s" .Chart.Name .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The full name with a suffix, at most 63 characters too (a Service's name
is a DNS label, a Job's a label value): the full name is cut, not the
suffix. Called with (list . "suffix"). */}}
{{- define "shoal.suffixed" -}}
{{- $suffix := index . 1 -}}
{{- $base := include "shoal.fullname" (index . 0) | trunc (int (sub 62 (len $suffix))) | trimSuffix "-" -}}
{{- printf "%s-%s" $base $suffix -}}
{{- end -}}

{{- define "shoal.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "shoal.labels" -}}
{{ include "shoal.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shoal
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "shoal.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "shoal.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "shoal.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* An imagePullSecrets entry's name: a string, or an object with a name. */}}
{{- define "shoal.pullSecretName" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end -}}
{{- end -}}

{{/* The imagePullSecrets' names, each once (the API server warns of a repeat). */}}
{{- define "shoal.pullSecretNames" -}}
{{- $names := list }}
{{- range . }}{{ $names = append $names (include "shoal.pullSecretName" .) }}{{ end }}
{{- $names | uniq | toJson }}
{{- end -}}

{{- define "shoal.pullSecrets" -}}
{{- range include "shoal.pullSecretNames" . | fromJsonArray }}
- name: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The labels shoal puts on its pods of one component (router, engine). */}}
{{- define "shoal.networkPolicy.shoalLabels" -}}
app.kubernetes.io/component: {{ . }}
app.kubernetes.io/managed-by: shoal
{{- end -}}

{{/* A podSelector for shoal's pods of one component, of some VLLMCluster. */}}
{{- define "shoal.networkPolicy.shoalPods" -}}
matchLabels:
  {{- include "shoal.networkPolicy.shoalLabels" . | nindent 2 }}
matchExpressions:
  - key: serving.shoal.dev/cluster
    operator: Exists
{{- end -}}

{{/* A NetworkPolicy peer: this release's operator pods, in its namespace. */}}
{{- define "shoal.networkPolicy.operatorPeer" -}}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ .Release.Namespace | quote }}
  podSelector:
    matchLabels:
      {{- include "shoal.selectorLabels" . | nindent 6 }}
{{- end -}}
