{{/*
Chart name, truncated to 63 characters (the limit of a label value and of many names).
*/}}
{{- define "basalt-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects: the release name, with the chart name appended unless the
release name already contains it.
*/}}
{{- define "basalt-operator.fullname" -}}
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
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "basalt-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object of the release.
*/}}
{{- define "basalt-operator.labels" -}}
helm.sh/chart: {{ include "basalt-operator.chart" . }}
{{ include "basalt-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: basalt
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Labels that select the operator's pods (stable across upgrades: never add the version here).
*/}}
{{- define "basalt-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "basalt-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Name of the operator's ServiceAccount.
*/}}
{{- define "basalt-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "basalt-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator's image reference.
*/}}
{{- define "basalt-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
The tablet servers' default image: tabletServer.image, or the tablet server of the chart's
appVersion.
*/}}
{{- define "basalt-operator.tabletServerImage" -}}
{{- .Values.tabletServer.image | default (printf "basalt/basalt-tablet-server:%s" .Chart.AppVersion) }}
{{- end }}
