{{/*
Expand the name of the chart.
*/}}
{{- define "cronman.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Create a default fully qualified app name.
We truncate at 63 chars because some Kubernetes name fields are limited to this (by the DNS naming spec).
If release name contains chart name it will be used as a full name.
*/}}
{{- define "cronman.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Name of one component's objects: (list $ "scheduler") or, with a shorter limit, (list $ "maintain" 52).
CronJob names may not exceed 52 characters.
*/}}
{{- define "cronman.componentName" -}}
{{- $ctx := index . 0 }}
{{- $max := 63 }}
{{- if gt (len .) 2 }}{{ $max = index . 2 }}{{ end }}
{{- $suffix := printf "-%s" (index . 1) }}
{{- $base := include "cronman.fullname" $ctx | trunc (int (sub $max (len $suffix))) | trimSuffix "-" }}
{{- printf "%s%s" $base $suffix }}
{{- end }}

{{/*
Create chart name and version as used by the chart label.
*/}}
{{- define "cronman.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels
*/}}
{{- define "cronman.labels" -}}
helm.sh/chart: {{ include "cronman.chart" . }}
{{ include "cronman.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: cronman
{{- end }}

{{/*
Selector labels (each workload adds app.kubernetes.io/component).
*/}}
{{- define "cronman.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cronman.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Create the name of the service account to use
*/}}
{{- define "cronman.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cronman.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The container image.
*/}}
{{- define "cronman.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}

{{/*
Name of the Secret holding CRONMAN_DATABASE_URL, CRONMAN_REDIS_URL and CRONMAN_API_KEY.
*/}}
{{- define "cronman.secretName" -}}
{{- .Values.existingSecret | default (include "cronman.fullname" .) }}
{{- end }}

{{/*
CRONMAN_DATABASE_URL: database.url, or a libpq URL built from database.hosts (several hosts for a
primary and its standbys), database.name, database.user and database.params. Empty when neither is set.
*/}}
{{- define "cronman.databaseUrl" -}}
{{- $db := .Values.database }}
{{- if $db.url }}
{{- $db.url }}
{{- else if $db.hosts }}
{{- $params := list }}
{{- range $key, $value := $db.params }}
{{- $params = append $params (printf "%s=%s" (urlquery $key) (urlquery (toString $value))) }}
{{- end }}
{{- $user := ternary (printf "%s@" (urlquery $db.user)) "" (ne $db.user "") }}
{{- printf "postgresql://%s%s/%s" $user (join "," $db.hosts) (urlquery $db.name) }}
{{- if $params }}?{{ join "&" $params }}{{ end }}
{{- end }}
{{- end }}

{{/*
CRONMAN_REDIS_URL: redis.url, or (cluster mode) the seeds joined with commas.
*/}}
{{- define "cronman.redisUrl" -}}
{{- .Values.redis.url | default (join "," .Values.redis.seeds) }}
{{- end }}

{{/*
Non-secret settings derived from redis.*; a key also set in config.* is left to config.
*/}}
{{- define "cronman.redisConfig" -}}
{{- $config := .Values.config }}
{{- $derived := dict "CRONMAN_REDIS_MODE" .Values.redis.mode }}
{{- if eq .Values.redis.mode "sentinel" }}
{{- $_ := set $derived "CRONMAN_REDIS_SENTINELS" (join "," .Values.redis.sentinel.sentinels) }}
{{- $_ := set $derived "CRONMAN_REDIS_SENTINEL_MASTER" .Values.redis.sentinel.master }}
{{- end }}
{{- range $key, $value := $derived }}
{{- if not (hasKey $config $key) }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Non-secret settings derived from ingress.* and api.trustedProxies; a key also set in config.* is left
to config. TLS at the ingress: the dashboard's cookie is Secure and answers carry HSTS (the pods see
plain HTTP from the ingress).
*/}}
{{- define "cronman.ingressConfig" -}}
{{- $config := .Values.config }}
{{- $derived := dict }}
{{- if and .Values.ingress.enabled .Values.ingress.tls }}
{{- $_ := set $derived "CRONMAN_UI_SECURE_COOKIE" "true" }}
{{- end }}
{{- with .Values.api.trustedProxies }}
{{- $_ := set $derived "CRONMAN_TRUSTED_PROXIES" (join "," .) }}
{{- end }}
{{- range $key, $value := $derived }}
{{- if not (hasKey $config $key) }}
{{ $key }}: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Passwords read from existing Secrets: PGPASSWORD (libpq reads it when the URL has none),
CRONMAN_REDIS_PASSWORD and CRONMAN_REDIS_SENTINEL_PASSWORD.
*/}}
{{- define "cronman.secretEnv" -}}
{{- $refs := list (list "PGPASSWORD" .Values.database.passwordSecret) (list "CRONMAN_REDIS_PASSWORD" .Values.redis.passwordSecret) (list "CRONMAN_REDIS_SENTINEL_PASSWORD" .Values.redis.sentinel.passwordSecret) }}
{{- range $refs }}
{{- $ref := index . 1 }}
{{- if $ref.name }}
- name: {{ index . 0 }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.name }}
      key: {{ $ref.key }}
{{- end }}
{{- end }}
{{- end }}

{{/*
env of every cronman container after its own variables: the passwords from Secrets, then extraEnv.
*/}}
{{- define "cronman.env" -}}
{{- include "cronman.secretEnv" . }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
ConfigMap data: the non-secret CRONMAN_* settings. Whole numbers are printed without an exponent.
*/}}
{{- define "cronman.configData" -}}
{{- include "cronman.redisConfig" . }}
{{- include "cronman.ingressConfig" . }}
{{- range $key, $value := .Values.config }}
{{- if kindIs "float64" $value }}
{{- if eq $value (floor $value) }}
{{ $key }}: {{ int64 $value | toString | quote }}
{{- else }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- else }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Secret data (base64). Empty values are left out so the program never sees an empty URL.
*/}}
{{- define "cronman.secretData" -}}
{{- with include "cronman.databaseUrl" . }}
CRONMAN_DATABASE_URL: {{ . | b64enc | quote }}
{{- end }}
{{- with include "cronman.redisUrl" . }}
CRONMAN_REDIS_URL: {{ . | b64enc | quote }}
{{- end }}
{{- with .Values.auth.adminKey }}
CRONMAN_API_KEY: {{ . | b64enc | quote }}
{{- end }}
{{- end }}

{{/*
Pod annotations that roll the pods when the settings change.
*/}}
{{- define "cronman.checksums" -}}
checksum/config: {{ include "cronman.configData" . | sha256sum }}
checksum/secret: {{ printf "%s\n%s" (include "cronman.secretName" .) (include "cronman.secretData" .) | sha256sum }}
{{- end }}

{{/*
envFrom for the long-running pods and the CronJob: the ConfigMap, then the Secret (later sources win).
*/}}
{{- define "cronman.envFrom" -}}
- configMapRef:
    name: {{ include "cronman.fullname" . }}
- secretRef:
    name: {{ include "cronman.secretName" . }}
{{- with .Values.extraEnvFrom }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Writable scratch space (the root filesystem is read-only), and the extra volumes every cronman
container gets (e.g. the CA that signed PostgreSQL's certificate, for sslmode=verify-full).
*/}}
{{- define "cronman.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "cronman.volumes" -}}
- name: tmp
  emptyDir: {}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Refuse settings that cannot work.
*/}}
{{- define "cronman.validateValues" -}}
{{- $redis := .Values.redis }}
{{- if and (eq $redis.mode "sentinel") (not (hasKey .Values.config "CRONMAN_REDIS_SENTINELS")) (or (not $redis.sentinel.sentinels) (not $redis.sentinel.master)) }}
{{- fail "redis.mode=sentinel needs redis.sentinel.sentinels (host:port of each sentinel) and redis.sentinel.master (the master's name)" }}
{{- end }}
{{- if and (ne $redis.mode "cluster") (gt (len $redis.seeds) 0) }}
{{- fail "redis.seeds is for redis.mode=cluster; a standalone or Sentinel-managed Redis is named by redis.url" }}
{{- end }}
{{- if and .Values.database.url .Values.database.hosts }}
{{- fail "set database.url or database.hosts, not both" }}
{{- end }}
{{- $lease := .Values.config.CRONMAN_LEASE_SECONDS | default 5 | float64 }}
{{- $grace := .Values.scheduler.terminationGracePeriodSeconds | float64 }}
{{- if le $grace $lease }}
{{- fail (printf "scheduler.terminationGracePeriodSeconds (%v) must be longer than config.CRONMAN_LEASE_SECONDS (%v)" .Values.scheduler.terminationGracePeriodSeconds .Values.config.CRONMAN_LEASE_SECONDS) }}
{{- end }}
{{- end }}
