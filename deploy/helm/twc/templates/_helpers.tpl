{{/* Full name of the release's objects: the release name, with "-twc" unless it says twc. */}}
{{- define "twc.fullname" -}}
{{- if contains "twc" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-twc" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "twc.selectorLabels" -}}
app.kubernetes.io/name: twc
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "twc.labels" -}}
{{ include "twc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "twc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "twc.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "twc.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The controller's permissions, and only those; each rule names the code that needs it. The same
rules are in deploy/manifests/clusterrole.yaml (a test compares them).
*/}}
{{- define "twc.rules" -}}
# Watcher (src/watcher/): list+watch WorkerDeployments, TemporalWorkerDeployments and both kinds of connection, list TWDs when a connection
# changes, patch away the temporal.io/rollout-action annotation. Activities: get TWDs and
# connections (activities/src/k8s/twd.rs, connection.rs), list both and merge-patch their
# temporal.io/delete-protection finalizer (finalizers.rs).
- apiGroups: [temporal.io]
  resources: [workerdeployments, connections, temporalworkerdeployments, temporalconnections]
  verbs: [get, list, watch, patch]
# Status writes are merge patches of the status subresource (status.rs).
- apiGroups: [temporal.io]
  resources: [workerdeployments/status, connections/status, temporalworkerdeployments/status, temporalconnections/status]
  verbs: [patch]
# Versioned Deployments carry a controller owner reference to their TWD with
# blockOwnerDeletion: true; where the OwnerReferencesPermissionEnforcement admission plugin
# is on (e.g. OpenShift), setting it requires update on the owner's finalizers.
- apiGroups: [temporal.io]
  resources: [workerdeployments/finalizers, temporalworkerdeployments/finalizers]
  verbs: [update]
# Versioned Deployments (deployments.rs): list by label, get, create if absent, delete when
# retired; wait_for_pollers watches them by label to hear of Available at once, and so does
# the controller's Deployment watch (src/deployment_watch.rs) to wake held rollouts;
# reassert_resources (reassert.rs) updates them (a PUT) to follow connection changes and,
# under unsafeCustomBuildID, template edits; merge-patches their owner references when the
# other kind of a name takes over (claims.rs) and stamps Deployments taken over from the Go
# controller, whose templates a dry-run create compares (adoption.rs).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, update, patch, delete]
# Scaling is a merge patch of the scale subresource (scale_deployment).
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [patch]
# The replay check (replay_job.rs): a Job of the new build's template, created if absent and
# read until it ends (owned by the versioned Deployment, which sets blockOwnerDeletion off);
# its pods are listed for the container's exit code and termination message.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, create]
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
# Connection credentials (connection.rs) and gate inputFrom secretKeyRef (gate_input.rs):
# single reads by name.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
# Gate inputFrom configMapKeyRef (gate_input.rs): single reads by name.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get]
# Events on TWDs and WorkerResourceTemplates through kube-runtime's events Recorder
# (events.rs), which writes events.k8s.io/v1; a new Recorder per event always creates, never
# patches a series.
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create]
# The WorkerResourceTemplate controller (src/resource_templates/controller.rs): kube-runtime's
# Controller lists and watches templates (and the Deployments and worker deployments above);
# their status is a merge patch of the status subresource.
- apiGroups: [temporal.io]
  resources: [workerresourcetemplates]
  verbs: [list, watch]
- apiGroups: [temporal.io]
  resources: [workerresourcetemplates/status]
  verbs: [patch]
# Copies carry a controller owner reference to their template with blockOwnerDeletion: true
# (see the finalizers rule above).
- apiGroups: [temporal.io]
  resources: [workerresourcetemplates/finalizers]
  verbs: [update]
# The admission webhook (src/resource_templates/admission.rs) asks whether a template's author
# may create, update and delete what it renders, in the template's namespace.
- apiGroups: [authorization.k8s.io]
  resources: [localsubjectaccessreviews]
  verbs: [create]
# The kinds templates may render (workerResourceTemplate.allowedResources): copies are
# server-side applied, deleted with their version, and listed by the periodic sweep.
{{- range .Values.workerResourceTemplate.allowedResources }}
- apiGroups: {{ toJson .apiGroups }}
  resources: {{ toJson .resources }}
  verbs: [create, delete, get, list, patch, update]
{{- end }}
{{- end -}}

{{/* The kinds of workerResourceTemplate.allowedResources, comma-separated (--wrt-allowed-kinds). */}}
{{- define "twc.allowedKinds" -}}
{{- $kinds := list -}}
{{- range .Values.workerResourceTemplate.allowedResources -}}
{{- $kinds = concat $kinds .kinds -}}
{{- end -}}
{{- join "," $kinds -}}
{{- end -}}

{{/* Names of the admission webhook's Service and serving-certificate Secret. */}}
{{- define "twc.webhookService" -}}
{{- printf "%s-webhook" (include "twc.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "twc.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "twc.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* Rules on cluster-scoped objects: only in the ClusterRole (a controller restricted to
namespaces leaves ClusterConnections alone and reports ClusterConnectionUnsupported). */ -}}
{{- define "twc.clusterRules" -}}
# ClusterConnections: the watcher lists and watches them (src/watcher/); activities get them
# (connection.rs), list them and merge-patch their temporal.io/delete-protection finalizer
# (finalizers.rs; their users are TWDs of every namespace, listed by a field selector).
- apiGroups: [temporal.io]
  resources: [clusterconnections]
  verbs: [get, list, watch, patch]
# Their Ready condition: merge patches of the status subresource (status.rs).
- apiGroups: [temporal.io]
  resources: [clusterconnections/status]
  verbs: [patch]
# The deletion path reads a deleted TWD's namespace, to know whether it is being deleted too
# (then a cleanup of Temporal that cannot be done is given up; engine.rs, twd.rs).
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get]
{{- end -}}

{{/* Name of cluster-scoped objects: unique per release and namespace. */}}
{{- define "twc.clusterName" -}}
{{- printf "%s-%s" (include "twc.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}
