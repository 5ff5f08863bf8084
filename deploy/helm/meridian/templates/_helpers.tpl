{{/* The controller's object names: <release>-controller and its Services. */}}
{{- define "meridian.fullname" -}}
{{- printf "%s-controller" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "meridian.region" -}}
{{- required "region is required (e.g. us-east-1)" .Values.region -}}
{{- end -}}

{{- define "meridian.controllerID" -}}
{{- default (printf "%s-0" (include "meridian.region" .)) .Values.controllerID -}}
{{- end -}}

{{/* Labels that select the controller's pods. */}}
{{- define "meridian.selectorLabels" -}}
app.kubernetes.io/name: meridian
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "meridian.labels" -}}
{{ include "meridian.selectorLabels" . }}
app.kubernetes.io/part-of: meridian
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
meridian.io/region: {{ include "meridian.region" . }}
{{- end -}}

{{/*
The controller's configuration file (regional.Config) without secrets: the
admin token, gossip key and audit HMAC key come from secrets.name through
MERIDIAN_ADMIN_TOKEN, MERIDIAN_GOSSIP_KEY and MERIDIAN_AUDIT_KEY.
*/}}
{{- define "meridian.config" -}}
{{- if ne (int .Values.replicas) 1 -}}
{{- fail "replicas: one controller per region (as deploy/k8s runs it): the controller id and the addresses other regions reach are one per region" -}}
{{- end -}}
{{- $host := required "advertise.host is required: the DNS name other regions reach this controller on" .Values.advertise.host -}}
{{- $p := .Values.ports -}}
{{- if not .Values.kafka.brokers -}}
{{- fail "kafka.brokers is required: this region's Kafka bootstrap servers" -}}
{{- end -}}
{{- $kafka := dict "brokers" .Values.kafka.brokers -}}
{{- with .Values.kafka.topic }}{{ $_ := set $kafka "topic" . }}{{ end -}}
{{- with .Values.kafka.tls }}{{ $_ := set $kafka "tls" . }}{{ end -}}
{{- if .Values.kafka.sasl.username }}{{ $_ := set $kafka "sasl" .Values.kafka.sasl }}{{ end -}}
{{- $gossip := dict "bind" (printf "0.0.0.0:%v" $p.gossip) "advertise" (required "advertise.gossipAddress is required: the IP:port other regions reach for gossip" .Values.advertise.gossipAddress) "join" .Values.gossip.join -}}
{{- with .Values.gossip.staticRTT }}{{ $_ := set $gossip "static_rtt" . }}{{ end -}}
{{- $cfg := dict
  "region" (include "meridian.region" .)
  "controller_id" (include "meridian.controllerID" .)
  "listen" (printf ":%v" $p.http)
  "admin_listen" (printf ":%v" $p.admin)
  "public_url" (printf "https://%s:%v" $host $p.http)
  "admin_url" (printf "https://%s:%v" $host $p.admin)
  "tls" (dict "cert" "/etc/meridian/tls/tls.crt" "key" "/etc/meridian/tls/tls.key" "client_ca" "/etc/meridian/tls/ca.crt")
  "auth" (dict "mode" "api_keys" "api_keys" (dict "file" "/etc/meridian/auth/api-keys.yaml"))
  "policy_file" "/etc/meridian/policy/residency-policy.yaml"
  "raft" (dict "data_dir" "/var/lib/meridian/raft" "bind" (printf "0.0.0.0:%v" $p.raft) "advertise" (printf "%s:%v" $host $p.raft) "bootstrap" .Values.raft.bootstrap "join" .Values.raft.join "voters" .Values.raft.voters "wan" .Values.raft.wan)
  "gossip" $gossip
  "audit" (dict "dir" "/var/lib/meridian/audit")
  "auto_failover" (dict "enabled" .Values.autoFailover.enabled)
  "kafka" $kafka
  "models" .Values.models
  "pods" (dict "discovery" (dict "dns" (include "meridian.discovery" . | fromYaml)))
-}}
{{- toYaml (mustMergeOverwrite $cfg (deepCopy .Values.extraConfig)) -}}
{{- end -}}

{{- define "meridian.policy" -}}
{{- default (.Files.Get "files/residency-policy.yaml") .Values.policy -}}
{{- end -}}


{{/* The engines' discovery (pods.discovery.dns): the controller's and the kv-bridge's. */}}
{{- define "meridian.discovery" -}}
{{- if not .Values.discovery.dns.name -}}
{{- fail "discovery.dns.name is required: the engines' headless Service, e.g. vllm.inference.svc.cluster.local." -}}
{{- end -}}
{{- toYaml .Values.discovery.dns -}}
{{- end -}}

{{- define "meridian.bridgeName" -}}
{{- printf "%s-kv-bridge" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "meridian.bridgeSelectorLabels" -}}
app.kubernetes.io/name: meridian
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kv-bridge
{{- end -}}

{{- define "meridian.bridgeLabels" -}}
{{ include "meridian.bridgeSelectorLabels" . }}
app.kubernetes.io/part-of: meridian
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
meridian.io/region: {{ include "meridian.region" . }}
{{- end -}}

{{/*
The kv-bridge's configuration file (kvbridge.Config): the controller's
Kafka brokers and TLS under the bridge's own user, the controller's
discovery plus the engines' ZMQ ports.
*/}}
{{- define "meridian.bridgeConfig" -}}
{{- $b := .Values.kvBridge -}}
{{- $kafka := dict -}}
{{- with .Values.kafka.tls }}{{ $_ := set $kafka "tls" . }}{{ end -}}
{{- if $b.kafkaUsername -}}
{{- $_ := set $kafka "sasl" (dict "mechanism" .Values.kafka.sasl.mechanism "username" $b.kafkaUsername "password_file" (printf "/etc/meridian/kafka/%s" $b.kafkaPasswordKey)) -}}
{{- end -}}
{{- $dns := include "meridian.discovery" . | fromYaml -}}
{{- $_ := set $dns "kv_events_port" (int $b.kvEventsPort) -}}
{{- if $b.replayPort }}{{ $_ := set $dns "replay_port" (int $b.replayPort) }}{{ end -}}
{{- $cfg := dict
  "region" (include "meridian.region" .)
  "brokers" .Values.kafka.brokers
  "discovery" (dict "dns" $dns)
  "announce_interval" $b.announceInterval
  "metrics_addr" (printf ":%v" $b.metricsPort)
-}}
{{- with .Values.kafka.topic }}{{ $_ := set $cfg "topic" . }}{{ end -}}
{{- if $kafka }}{{ $_ := set $cfg "kafka" $kafka }}{{ end -}}
{{- toYaml $cfg -}}
{{- end -}}
