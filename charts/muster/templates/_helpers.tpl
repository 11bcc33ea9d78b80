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

{{/* "true" when managedNamespaceSelector selects by anything (docs/tenancy.md); null or {}
manages no namespace. */}}
{{- define "muster.managed" -}}
{{- $s := .Values.managedNamespaceSelector | default dict -}}
{{- if or $s.matchLabels $s.matchExpressions -}}true{{- end -}}
{{- end -}}

{{/* managedNamespaceSelector in kubectl's label-selector syntax, for the controller's
--managed-namespace-selector (which reads it back into the same selector). */}}
{{- define "muster.managedSelectorFlag" -}}
{{- $s := .Values.managedNamespaceSelector | default dict -}}
{{- $terms := list -}}
{{- range $key, $value := ($s.matchLabels | default dict) -}}
{{- $terms = append $terms (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- range ($s.matchExpressions | default list) -}}
{{- if eq .operator "In" -}}
{{- $terms = append $terms (printf "%s in (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "NotIn" -}}
{{- $terms = append $terms (printf "%s notin (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "Exists" -}}
{{- $terms = append $terms .key -}}
{{- else -}}
{{- $terms = append $terms (printf "!%s" .key) -}}
{{- end -}}
{{- end -}}
{{- join "," $terms -}}
{{- end -}}

{{/* The namespaceSelector of the managed-namespace webhooks: managedNamespaceSelector,
never kube-system (as controllers/webhooks/configurations.py writes it). */}}
{{- define "muster.managedWebhookNamespaces" -}}
{{- $s := .Values.managedNamespaceSelector | default dict -}}
{{- with $s.matchLabels }}
matchLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
matchExpressions:
  - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system]}
  {{- with $s.matchExpressions }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}
