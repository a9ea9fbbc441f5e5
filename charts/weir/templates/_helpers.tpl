{{/* Names. */}}
{{- define "weir.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "weir.fullname" -}}
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

{{- define "weir.controller.fullname" -}}
{{- printf "%s-controller" (include "weir.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "weir.node.fullname" -}}
{{- printf "%s-node" (include "weir.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "weir.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "weir.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "weir.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "weir.electionID" -}}
{{- default (printf "%s-leader" (include "weir.fullname" .)) .Values.controller.electionID -}}
{{- end -}}

{{/* Labels. */}}
{{- define "weir.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: weir
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "weir.selectorLabels" -}}
app.kubernetes.io/name: {{ include "weir.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "weir.controller.selectorLabels" -}}
{{ include "weir.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "weir.node.selectorLabels" -}}
{{ include "weir.selectorLabels" . }}
app.kubernetes.io/component: node
{{- end -}}

{{/* The image reference of an image dict (registry, repository, tag, digest). */}}
{{- define "weir.imageRef" -}}
{{- $img := .image -}}
{{- $repo := $img.repository -}}
{{- if $img.registry -}}{{- $repo = printf "%s/%s" $img.registry $img.repository -}}{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .appVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{- define "weir.image" -}}
{{- include "weir.imageRef" (dict "image" .Values.image "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{- define "weir.node.image" -}}
{{- include "weir.imageRef" (dict "image" (merge (dict) .Values.node.image .Values.image) "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{/* The wildcard address of the pods' first IP family, and the pod IP as a socket host. */}}
{{- define "weir.ipv6" -}}
{{- if eq (first (default (list "IPv4") .Values.controller.service.ipFamilies)) "IPv6" -}}true{{- end -}}
{{- end -}}

{{- define "weir.anyAddress" -}}
{{- if include "weir.ipv6" . -}}[::]{{- else -}}0.0.0.0{{- end -}}
{{- end -}}

{{- define "weir.podAddress" -}}
{{- if include "weir.ipv6" . -}}[$(POD_IP)]{{- else -}}$(POD_IP){{- end -}}
{{- end -}}

{{/* Whether the controller runs a PodDisruptionBudget (ingress-nginx's rule). */}}
{{- define "weir.pdb.enabled" -}}
{{- if and (eq .Values.controller.kind "Deployment") (or (gt (int .Values.controller.replicaCount) 1) .Values.controller.autoscaling.enabled) -}}true{{- end -}}
{{- end -}}

{{/*
API versions that follow the cluster: the GA version where the API server lists it (helm install
and upgrade read discovery) or where the Kubernetes version serves it (helm template
--kube-version), else the beta version older clusters serve.
*/}}
{{- define "weir.pdb.apiVersion" -}}
{{- if or (.Capabilities.APIVersions.Has "policy/v1/PodDisruptionBudget") (semverCompare ">=1.21-0" .Capabilities.KubeVersion.Version) -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end -}}
{{- end -}}

{{- define "weir.hpa.apiVersion" -}}
{{- if or (.Capabilities.APIVersions.Has "autoscaling/v2/HorizontalPodAutoscaler") (semverCompare ">=1.23-0" .Capabilities.KubeVersion.Version) -}}
autoscaling/v2
{{- else -}}
autoscaling/v2beta2
{{- end -}}
{{- end -}}

{{/*
ingress-nginx chart keys weir accepts but does not use, with the reason NOTES.txt gives.
values.schema.json declares each of them (a test checks that the two lists agree).
*/}}
{{- define "weir.ignoredKeys" -}}
defaultBackend: weir answers 404 itself; a default backend is an Ingress's spec.defaultBackend
portNamePrefix: weir's ports have fixed names (http, https, metrics)
dhParam: weir's TLS (rustls) uses ECDHE only, no DH parameters
commonLabels: not supported; use controller.podLabels and controller.service.labels
controller.admissionWebhooks: weir validates Ingresses as it reads them (Events and `weir check`), no webhook
controller.allowSnippetAnnotations: weir never accepts configuration snippets
controller.enableAnnotationValidations: weir always validates annotations
controller.image: the image is set by the top-level image key
controller.ingressClass: deprecated in ingress-nginx; use controller.ingressClassResource.name
controller.ingressClassByName: weir matches classes by name and controller value already
controller.addHeaders: use controller.config add-headers (a ConfigMap NAMESPACE/NAME)
controller.proxySetHeaders: use controller.config proxy-set-headers (a ConfigMap NAMESPACE/NAME)
controller.customTemplate: weir has no nginx template
controller.opentelemetry: not supported
controller.maxmindLicenseKey: not supported
controller.keda: not supported; use controller.autoscaling
controller.enableMimalloc: not applicable to weir
controller.lifecycle: the image has no shell; weir drains on SIGTERM (see controller.preStopSleepSeconds)
controller.healthCheckPath: weir's probes are /healthz and /readyz (controller.livenessProbe, controller.readinessProbe)
controller.healthCheckHost: the admin listener binds the pod IP
controller.sysctls: weir needs none
controller.electionTTL: weir's Lease lasts 15 s; set controller.extraArgs election-lease-duration
controller.reportNodeInternalIp: not supported; use controller.publishService
controller.extraInitContainers: not supported
controller.extraContainers: not supported
controller.containerName: the container is named weir
controller.enableTopologyAwareRouting: not supported
controller.progressDeadlineSeconds: not supported
controller.labels: not supported; use controller.podLabels
controller.annotations: not supported; use controller.podAnnotations
controller.networkPolicy: not supported
controller.startupProbe: weir is ready in seconds; use controller.readinessProbe
controller.dnsConfig: not supported
controller.hostAliases: not supported
controller.configAnnotations: not supported
controller.existingPsp: PodSecurityPolicy is gone from Kubernetes
podSecurityPolicy: PodSecurityPolicy is gone from Kubernetes
controller.ingressClassResource.parameters: weir's IngressClass takes no parameters
controller.service.external: the Service is controller.service.enabled
controller.service.internal: weir renders no internal Service
controller.service.targetPorts: the Service targets the named container ports
controller.scope.namespaceSelector: weir watches one namespace or all
controller.metrics.portName: the port is named metrics
rbac.scope: weir's rights are cluster-wide reads
{{- end -}}

{{/* The ignored keys this values file sets, one "  - KEY: REASON" a line. */}}
{{- define "weir.ignoredSet" -}}
{{- range $key, $reason := (include "weir.ignoredKeys" . | fromYaml) -}}
{{- $node := $.Values -}}
{{- $set := true -}}
{{- range $part := splitList "." $key -}}
{{- if and $set (kindIs "map" $node) (hasKey $node $part) -}}
{{- $node = index $node $part -}}
{{- else -}}
{{- $set = false -}}
{{- end -}}
{{- end -}}
{{- if $set }}
  - {{ $key }}: {{ $reason }}
{{- end -}}
{{- end -}}
{{- end -}}
