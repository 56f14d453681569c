{{- define "tessera.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tessera.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tessera.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "tessera.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Launcher flags as its environment variables: value key -> variable name. */}}
{{- define "tessera.launcherEnv" -}}
{{- $names := dict
  "modelId" "MODEL_ID" "servedModelName" "SERVED_MODEL_NAME" "hostname" "TESSERA_HOSTNAME"
  "port" "PORT" "shardUdsPath" "SHARD_UDS_PATH" "masterAddr" "MASTER_ADDR"
  "masterPort" "MASTER_PORT" "dtype" "DTYPE" "kvCacheMemory" "KV_CACHE_MEMORY"
  "memoryFraction" "MEMORY_FRACTION" "blockSize" "BLOCK_SIZE"
  "maxConcurrentRequests" "MAX_CONCURRENT_REQUESTS" "maxStopSequences" "MAX_STOP_SEQUENCES"
  "maxTopNTokens" "MAX_TOP_N_TOKENS" "maxInputTokens" "MAX_INPUT_TOKENS"
  "maxTotalTokens" "MAX_TOTAL_TOKENS" "maxBatchPrefillTokens" "MAX_BATCH_PREFILL_TOKENS"
  "maxBatchTotalTokens" "MAX_BATCH_TOTAL_TOKENS" "maxBatchSize" "MAX_BATCH_SIZE"
  "maxWaitingTokens" "MAX_WAITING_TOKENS" "payloadLimit" "PAYLOAD_LIMIT"
  "jsonOutput" "JSON_OUTPUT" "prefixCaching" "PREFIX_CACHING" "speculate" "SPECULATE"
  "speculator" "SPECULATOR" "draftModelId" "DRAFT_MODEL_ID" "otlpEndpoint" "OTLP_ENDPOINT"
  "otlpServiceName" "OTLP_SERVICE_NAME" "shutdownGracePeriod" "SHUTDOWN_GRACE_PERIOD"
  "shardStartupTimeout" "SHARD_STARTUP_TIMEOUT" -}}
- name: NUM_SHARD
  value: {{ .Values.numShard | quote }}
{{- range $key, $env := $names }}
{{- $value := index $.Values.launcher $key }}
{{- if or (kindIs "bool" $value) (and (not (kindIs "invalid" $value)) (ne (toString $value) "")) }}
{{- $text := toString $value }}
{{- if and (kindIs "float64" $value) (eq (float64 (int64 $value)) $value) }}
{{- $text = toString (int64 $value) }}
{{- end }}
- name: {{ $env }}
  value: {{ $text | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "tessera.terminationGracePeriod" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds -}}
{{- add (mul 3 (int (default 10 .Values.launcher.shutdownGracePeriod))) 15 -}}
{{- else -}}
{{- .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

{{/* Labels of the pods that serve HTTP: all server pods, or the leaders in LeaderWorkerSet mode. */}}
{{- define "tessera.servingSelectorLabels" -}}
{{ include "tessera.selectorLabels" . }}
{{- if .Values.leaderWorkerSet.enabled }}
leaderworkerset.sigs.k8s.io/worker-index: "0"
{{- end }}
{{- end -}}

{{- define "tessera.eppName" -}}
{{- printf "%s-epp" (include "tessera.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
