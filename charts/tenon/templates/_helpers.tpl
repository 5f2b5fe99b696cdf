{{/*
The chart's name, at most 63 characters (a label value).
*/}}
{{- define "tenon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: fullnameOverride, else the release name when it contains the
chart's name, else RELEASE-CHART; at most 63 characters.
*/}}
{{- define "tenon.fullname" -}}
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
The chart's name and version, as the helm.sh/chart label.
*/}}
{{- define "tenon.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The labels of every object.
*/}}
{{- define "tenon.labels" -}}
helm.sh/chart: {{ include "tenon.chart" . }}
{{ include "tenon.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The labels that select the operator's pods.
*/}}
{{- define "tenon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tenon.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The name of the ServiceAccount the operator runs as.
*/}}
{{- define "tenon.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tenon.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator's image: repository:tag (the chart's appVersion when image.tag is empty), or
repository@digest when image.digest is set.
*/}}
{{- define "tenon.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}
{{- end }}

{{/*
The leader-election Lease's name, the metrics port and the health-probe port: the setting, or the
binary's default when it is unset.
*/}}
{{- define "tenon.leaderElectionName" -}}
{{- dig "leaderElectionName" "tenon-leader-election" (.Values.settings | default dict) }}
{{- end }}
{{- define "tenon.metricsPort" -}}
{{- include "tenon.envValue" (dig "metricsPort" 8080 (.Values.settings | default dict)) }}
{{- end }}
{{- define "tenon.healthProbePort" -}}
{{- include "tenon.envValue" (dig "healthProbePort" 8081 (.Values.settings | default dict)) }}
{{- end }}

{{/*
A setting's value as environment-variable text: booleans as true/false, whole numbers without a
fraction or an exponent (values files give helm every number as a float), anything else as written.
*/}}
{{- define "tenon.envValue" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) }}
{{- int64 . }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/*
Every setting tenon reads, in `tenon settings`' order: its key under values.settings and its environment
variable.
*/}}
{{- define "tenon.settingsTable" -}}
clusterName: CLUSTER_NAME
batchIdleDuration: BATCH_IDLE_DURATION
batchMaxDuration: BATCH_MAX_DURATION
launchTimeout: LAUNCH_TIMEOUT
registrationTimeout: REGISTRATION_TIMEOUT
nodeclaimInitializationTimeout: NODECLAIM_INITIALIZATION_TIMEOUT
featureGates: FEATURE_GATES
consolidationSplitFallback: CONSOLIDATION_SPLIT_FALLBACK
maxConsolidationReplacements: MAX_CONSOLIDATION_REPLACEMENTS
consolidationSplitMaxAttempts: CONSOLIDATION_SPLIT_MAX_ATTEMPTS
consolidationSplitMinSavings: CONSOLIDATION_SPLIT_MIN_SAVINGS
marginalCostPacking: MARGINAL_COST_PACKING
odToSpotConsolidation: OD_TO_SPOT_CONSOLIDATION
spotToSpotMinInstanceTypes: SPOT_TO_SPOT_MIN_INSTANCE_TYPES
consolidationReplaceMinSavings: CONSOLIDATION_REPLACE_MIN_SAVINGS
disruptionPollPeriod: DISRUPTION_POLL_PERIOD
commandValidationDelay: COMMAND_VALIDATION_DELAY
singleNodeConsolidationTimeout: SINGLE_NODE_CONSOLIDATION_TIMEOUT
multiNodeConsolidationTimeout: MULTI_NODE_CONSOLIDATION_TIMEOUT
unavailableOfferingsTtl: UNAVAILABLE_OFFERINGS_TTL
orphanInstanceGrace: ORPHAN_INSTANCE_GRACE
vanishedInstanceGrace: VANISHED_INSTANCE_GRACE
maxInstanceTypes: MAX_INSTANCE_TYPES
preferencePolicy: PREFERENCE_POLICY
minValuesPolicy: MIN_VALUES_POLICY
logLevel: LOG_LEVEL
providers: PROVIDERS
leaderElectionName: LEADER_ELECTION_NAME
disableLeaderElection: DISABLE_LEADER_ELECTION
metricsPort: METRICS_PORT
healthProbePort: HEALTH_PROBE_PORT
interruptionQueue: INTERRUPTION_QUEUE
vmMemoryOverheadPercent: VM_MEMORY_OVERHEAD_PERCENT
clusterEndpoint: CLUSTER_ENDPOINT
clusterCaBundle: CLUSTER_CA_BUNDLE
clusterServiceCidr: CLUSTER_SERVICE_CIDR
isolatedVpc: ISOLATED_VPC
projectId: PROJECT_ID
clusterLocation: CLUSTER_LOCATION
defaultNodepoolServiceAccount: DEFAULT_NODEPOOL_SERVICE_ACCOUNT
defaultNodepoolTemplateName: DEFAULT_NODEPOOL_TEMPLATE_NAME
azureSubscriptionId: AZURE_SUBSCRIPTION_ID
azureNodeResourceGroup: AZURE_NODE_RESOURCE_GROUP
azureLocation: AZURE_LOCATION
azureTenantId: AZURE_TENANT_ID
vnetSubnetId: VNET_SUBNET_ID
networkPlugin: NETWORK_PLUGIN
networkPluginMode: NETWORK_PLUGIN_MODE
networkPolicy: NETWORK_POLICY
dnsServiceIp: DNS_SERVICE_IP
sshPublicKey: SSH_PUBLIC_KEY
nodeIdentities: NODE_IDENTITIES
kubeletIdentityClientId: KUBELET_IDENTITY_CLIENT_ID
networkSecurityGroup: NETWORK_SECURITY_GROUP
azureCustomDataFile: AZURE_CUSTOM_DATA_FILE
kwokCatalog: KWOK_CATALOG
kwokRegistrationDelay: KWOK_REGISTRATION_DELAY
{{- end }}

{{/*
FEATURE_GATES' value from settings.featureGates ({spotToSpotConsolidation: false, ...}):
SpotToSpotConsolidation=false,...: the gates tenon knows in its order, then any other keys sorted; gates
set to null or "" are left out; empty when none is set. A string is taken as written (Name=true,...).
*/}}
{{- define "tenon.featureGates" -}}
{{- if kindIs "string" . }}
{{- . }}
{{- else }}
{{- $gates := . | default dict }}
{{- $order := list "spotToSpotConsolidation" "nodeRepair" "reservedCapacity" "nodeOverlay" "staticCapacity" }}
{{- range (keys $gates | sortAlpha) }}
{{- if not (has . $order) }}
{{- $order = append $order . }}
{{- end }}
{{- end }}
{{- $parts := list }}
{{- range $order }}
{{- $v := get $gates . }}
{{- if and (hasKey $gates .) (not (kindIs "invalid" $v)) (ne (toString $v) "") }}
{{- $parts = append $parts (printf "%s%s=%s" (upper (substr 0 1 .)) (substr 1 -1 .) (include "tenon.envValue" $v)) }}
{{- end }}
{{- end }}
{{- join "," $parts }}
{{- end }}
{{- end }}

{{/*
The container's environment for the settings: one variable per setting that is set (not null, not ""),
in the table's order. A key under values.settings that is no setting of tenon's fails the rendering.
*/}}
{{- define "tenon.settingsEnv" -}}
{{- $settings := .Values.settings | default dict }}
{{- $table := include "tenon.settingsTable" . | fromYaml }}
{{- range $key, $_ := $settings }}
{{- if not (hasKey $table $key) }}
{{- fail (printf "settings.%s is not a setting of tenon's (values.yaml lists them all)" $key) }}
{{- end }}
{{- end }}
{{- range $line := include "tenon.settingsTable" . | splitList "\n" }}
{{- $key := trim (first (splitList ":" $line)) }}
{{- $env := get $table $key }}
{{- $v := get $settings $key }}
{{- if eq $key "featureGates" }}
{{- $gates := include "tenon.featureGates" $v }}
{{- if $gates }}
- name: {{ $env }}
  value: {{ $gates | quote }}
{{- end }}
{{- else if and (hasKey $settings $key) (not (kindIs "invalid" $v)) (ne (toString $v) "") }}
- name: {{ $env }}
  value: {{ include "tenon.envValue" $v | quote }}
{{- end }}
{{- end }}
{{- end }}
