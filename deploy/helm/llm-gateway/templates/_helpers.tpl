{{/* The chart's name, the value of app.kubernetes.io/name on every resource. */}}
{{- define "llm-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The resources' name prefix: the release name when it already contains the
chart's name (`helm install llm-gateway …` gives the Kustomize base's names:
llm-gateway, llm-gateway-config, llm-gateway-routes, …), else
<release>-<chart>.
*/}}
{{- define "llm-gateway.fullname" -}}
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

{{/* Selectors: the base's app.kubernetes.io/name plus the release, so two releases never select each other's pods. */}}
{{- define "llm-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llm-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "llm-gateway.labels" -}}
{{ include "llm-gateway.selectorLabels" . }}
app.kubernetes.io/part-of: llm-gateway
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "llm-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "llm-gateway.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "llm-gateway.apiKeysSecret" -}}
{{- default (printf "%s-api-keys" (include "llm-gateway.fullname" .)) .Values.existingSecret -}}
{{- end -}}

{{- define "llm-gateway.routesConfigMap" -}}
{{- default (printf "%s-routes" (include "llm-gateway.fullname" .)) .Values.existingRoutesConfigMap -}}
{{- end -}}

{{- define "llm-gateway.redisName" -}}
{{- printf "%s-redis" (include "llm-gateway.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The session store's URL: the chart's own Redis, else sessionStore.url, else none (each pod its own table). */}}
{{- define "llm-gateway.sessionStoreUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s:%d/0" (include "llm-gateway.redisName" .) (int .Values.redis.port) -}}
{{- else -}}
{{- .Values.sessionStore.url -}}
{{- end -}}
{{- end -}}

{{/* Whether to render a ServiceMonitor: "auto" when the cluster serves the Prometheus operator's CRD. */}}
{{- define "llm-gateway.serviceMonitor" -}}
{{- $create := toString .Values.serviceMonitor.create -}}
{{- if or (eq $create "true") (and (eq $create "auto") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor")) -}}
true
{{- else if not (has $create (list "true" "false" "auto")) -}}
{{- fail (printf "serviceMonitor.create is %q; it takes auto, true or false" $create) -}}
{{- end -}}
{{- end -}}

{{/*
Refusals at render time, for combinations that deploy but do not work.
*/}}
{{- define "llm-gateway.checks" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not (include "llm-gateway.sessionStoreUrl" .)) (not .Values.allowReplicasWithoutSessionStore) -}}
{{- fail (printf "replicaCount is %d without a shared session table: each pod would bind a conversation on its own and split its turns between engines' caches. Set redis.enabled=true (or sessionStore.url), or allowReplicasWithoutSessionStore=true when every route is `mode: hash`." (int .Values.replicaCount)) -}}
{{- end -}}
{{- $needed := add .Values.shutdown.preStopSleepSeconds .Values.shutdown.gracePeriodSeconds -}}
{{- if lt (int .Values.shutdown.terminationGracePeriodSeconds) (int $needed) -}}
{{- fail (printf "shutdown.terminationGracePeriodSeconds (%d) must cover preStopSleepSeconds + gracePeriodSeconds (%d): the kubelet kills the pod at that budget, cutting streams still draining" (int .Values.shutdown.terminationGracePeriodSeconds) (int $needed)) -}}
{{- end -}}
{{- range $key := list "listen" "admin_listen" "routes_dir" "api_keys_file" "watch" "grace_period" "session_store" -}}
{{- if hasKey $.Values.config $key -}}
{{- fail (printf "config.%s is set by the chart (see values.yaml: ports, shutdown, redis, sessionStore); the Deployment's ports and mounts follow it" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
