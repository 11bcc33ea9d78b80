{{/* The release's full name, at most 63 characters (a DNS label). */}}
{{- define "muster.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "muster.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "muster.labels" -}}
{{ include "muster.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "muster.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "muster.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "muster.webhookService" -}}
{{- printf "%s-webhook" (include "muster.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* SQLite keeps one file on one ReadWriteOnce volume: one replica. */}}
{{- define "muster.replicas" -}}
{{- if and .Values.history.enabled (eq .Values.history.database.type "sqlite") -}}
1
{{- else -}}
{{- .Values.replicaCount -}}
{{- end -}}
{{- end -}}

{{/* The webhook certificate Secret the controller keeps (controllers/webhooks/certs.py). */}}
{{- define "muster.certSecret" -}}muster-webhook-tls{{- end -}}

{{/* "policies" or "webhooks": what creates labelled Jobs suspended and checks them
(controllers/webhooks/policies.py, `--job-admission`); "" with the webhooks feature off. */}}
{{- define "muster.jobAdmission" -}}
{{- if not .Values.features.webhooks -}}
{{- else if ne .Values.webhook.jobAdmission "auto" -}}
{{- .Values.webhook.jobAdmission -}}
{{- else if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}
policies
{{- else -}}
webhooks
{{- end -}}
{{- end -}}
