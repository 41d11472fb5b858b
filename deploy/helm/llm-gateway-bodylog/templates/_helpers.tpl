{{- define "llm-gateway-bodylog.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release name when it contains the chart's name (`helm install llm-gateway-bodylog …` gives the component's names), else <release>-<chart>. */}}
{{- define "llm-gateway-bodylog.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "llm-gateway-bodylog.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llm-gateway-bodylog.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "llm-gateway-bodylog.labels" -}}
{{ include "llm-gateway-bodylog.selectorLabels" . }}
app.kubernetes.io/part-of: llm-gateway
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "llm-gateway-bodylog.serviceMonitor" -}}
{{- $create := toString .Values.serviceMonitor.create -}}
{{- if or (eq $create "true") (and (eq $create "auto") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor")) -}}
true
{{- else if not (has $create (list "true" "false" "auto")) -}}
{{- fail (printf "serviceMonitor.create is %q; it takes auto, true or false" $create) -}}
{{- end -}}
{{- end -}}

{{- define "llm-gateway-bodylog.claimName" -}}
{{- default (printf "%s-data" (include "llm-gateway-bodylog.fullname" .)) .Values.persistence.existingClaim -}}
{{- end -}}
