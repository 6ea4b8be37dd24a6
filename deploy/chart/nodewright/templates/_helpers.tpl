{{- define "nodewright.name" -}}nodewright{{- end -}}
{{- define "nodewright.fullname" -}}{{ printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "nodewright.labels" -}}
app.kubernetes.io/name: nodewright
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "nodewright.selectorLabels" -}}
app.kubernetes.io/name: nodewright
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}
{{- define "nodewright.webhookName" -}}{{ printf "%s-validation" (include "nodewright.fullname" .) }}{{- end -}}
{{- define "nodewright.certSecret" -}}{{ printf "%s-webhook-cert" (include "nodewright.fullname" .) }}{{- end -}}
