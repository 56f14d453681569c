{{/* The pod spec of a Tessera server: the Deployment's pods and, in LeaderWorkerSet mode, the
    leader pods (`role` is "server" or "leader"). */}}
{{- define "tessera.podSpec" -}}
{{- $role := .role }}
{{- with .root }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
# Longer than the launcher's drain: router stage + shard stage, each up to
# shutdownGracePeriod, plus margin.
terminationGracePeriodSeconds: {{ include "tessera.terminationGracePeriod" . }}
containers:
  - name: tessera
    image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command: ["tessera-launcher"]
    {{- with .Values.launcher.extraArgs }}
    args:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    env:
      {{- include "tessera.launcherEnv" . | nindent 6 }}
      - name: TESSERA_CACHE
        value: {{ printf "%s/cache" .Values.model.mountPath | quote }}
      # Where the shards compute and how they all-reduce, whichever image runs.
      - name: TESSERA_DEVICE
        value: {{ ternary "cuda" "cpu" .Values.gpu.enabled | quote }}
      - name: TESSERA_COMM
        value: {{ ternary "nccl" "shm" .Values.gpu.enabled | quote }}
      {{- if .Values.apiKey.existingSecret }}
      - name: API_KEY
        valueFrom:
          secretKeyRef:
            name: {{ .Values.apiKey.existingSecret }}
            key: {{ .Values.apiKey.secretKey }}
      {{- end }}
      {{- if eq $role "leader" }}
      # The group's rank 0 is this pod: the other pods' shards rendezvous with it.
      - name: MASTER_ADDR
        value: "$(LWS_LEADER_ADDRESS)"
      {{- end }}
      {{- with .Values.extraEnv }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    ports:
      - name: http
        containerPort: {{ .Values.launcher.port }}
        protocol: TCP
    # Until the model is loaded and warmed up (first /health 200) the other probes wait.
    startupProbe:
      httpGet:
        path: /health
        port: http
      {{- toYaml .Values.startupProbe | nindent 6 }}
    # /health answers 503 from the moment the server drains (SIGTERM), so the endpoint
    # leaves the Service and the InferencePool while streams in flight finish.
    readinessProbe:
      httpGet:
        path: /health
        port: http
      {{- toYaml .Values.readinessProbe | nindent 6 }}
    # /live answers while the router serves HTTP, draining or busy; the launcher (PID 1)
    # exits on its own when a shard or the router dies.
    livenessProbe:
      httpGet:
        path: /live
        port: http
      {{- toYaml .Values.livenessProbe | nindent 6 }}
    resources:
      {{- $resources := deepCopy .Values.resources }}
      {{- if .Values.gpu.enabled }}
      {{- $gpus := dict .Values.gpu.resourceName (int .Values.numShard) }}
      {{- $_ := set $resources "limits" (merge (default dict $resources.limits) $gpus) }}
      {{- $_ := set $resources "requests" (merge (default dict $resources.requests) $gpus) }}
      {{- end }}
      {{- toYaml $resources | nindent 6 }}
    {{- with .Values.securityContext }}
    securityContext:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      - name: shm
        mountPath: /dev/shm
      - name: model
        mountPath: {{ .Values.model.mountPath }}
        {{- if and .Values.model.persistentVolumeClaim.claimName .Values.model.persistentVolumeClaim.readOnly }}
        readOnly: true
        {{- end }}
volumes:
  - name: shm
    emptyDir:
      medium: Memory
      sizeLimit: {{ .Values.shm.sizeLimit }}
  - name: model
    {{- if .Values.model.persistentVolumeClaim.claimName }}
    persistentVolumeClaim:
      claimName: {{ .Values.model.persistentVolumeClaim.claimName }}
      readOnly: {{ .Values.model.persistentVolumeClaim.readOnly }}
    {{- else if .Values.model.hostPath }}
    hostPath:
      path: {{ .Values.model.hostPath }}
      type: Directory
    {{- else }}
    emptyDir:
      sizeLimit: {{ .Values.model.emptyDir.sizeLimit }}
    {{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}
