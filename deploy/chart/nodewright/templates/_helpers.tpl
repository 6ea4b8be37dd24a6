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

{{- /* An image reference: repository (or <registry>/<name>), then @digest or :tag. */ -}}
{{- define "nodewright.image" -}}
{{- $img := index . 0 -}}{{- $name := index . 1 -}}{{- $root := index . 2 -}}
{{- $repo := $img.repository -}}
{{- if not $repo -}}
{{- $registry := required "set registry (where `cargo xtask publish --registry REG` pushed the images) or image.repository and agent.image.repository: nodewright publishes no public images" $root.Values.registry -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" $registry) $name -}}
{{- end -}}
{{- if $img.digest -}}{{ printf "%s@%s" $repo $img.digest }}{{- else -}}{{ printf "%s:%s" $repo ($img.tag | default $root.Chart.AppVersion | toString) }}{{- end -}}
{{- end -}}
{{- define "nodewright.operatorImage" -}}{{ include "nodewright.image" (list .Values.image "operator" .) }}{{- end -}}
{{- define "nodewright.agentImage" -}}{{ include "nodewright.image" (list .Values.agent.image "agent" .) }}{{- end -}}
