{{/* The controller's object names: <release>-controller and its Services. */}}
{{- define "meridian.fullname" -}}
{{- printf "%s-controller" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "meridian.region" -}}
{{- required "region is required (e.g. us-east-1)" .Values.region -}}
{{- end -}}

{{/*
The replicas' controller ids are <prefix>-<ordinal> (the Raft server id,
gossip node name, audit directory and certificate identity of each).
*/}}
{{- define "meridian.idPrefix" -}}
{{- default (include "meridian.region" .) .Values.controllerIDPrefix -}}
{{- end -}}

{{/* The number of replicas, checked. */}}
{{- define "meridian.replicas" -}}
{{- $n := int .Values.replicas -}}
{{- if lt $n 1 -}}
{{- fail (printf "replicas: %v: want at least 1" .Values.replicas) -}}
{{- end -}}
{{- if not (has .Values.advertise.replicaAddress (list "podIP" "wanService")) -}}
{{- fail (printf "advertise.replicaAddress: %q: want podIP or wanService" .Values.advertise.replicaAddress) -}}
{{- end -}}
{{- if and (gt $n 1) (ne .Values.advertise.replicaAddress "podIP") -}}
{{- fail (printf "replicas: %d with advertise.replicaAddress %s: each replica needs an address of its own for Raft, gossip and its admin API (one WAN Service spreads over all of them); use advertise.replicaAddress podIP" $n .Values.advertise.replicaAddress) -}}
{{- end -}}
{{- $n -}}
{{- end -}}

{{/* The Secret holding replica $i's tls.crt, tls.key and ca.crt. */}}
{{- define "meridian.tlsSecret" -}}
{{- printf "%s-%v-tls" (default (include "meridian.fullname" .root) .root.Values.tls.secretPrefix) .i -}}
{{- end -}}

{{/*
The PodDisruptionBudget's limit: minAvailable replicas-1 by default (one
replica at a time: 2 of 3 as deploy/k8s), never all of them (a node drain
would wait for good); one replica: maxUnavailable 1.
*/}}
{{- define "meridian.pdbSpec" -}}
{{- $n := int (include "meridian.replicas" .) -}}
{{- if eq $n 1 -}}
maxUnavailable: 1
{{- else -}}
{{- $min := int (default (sub $n 1) .Values.podDisruptionBudget.minAvailable) -}}
{{- if or (lt $min 1) (ge $min $n) -}}
{{- fail (printf "podDisruptionBudget.minAvailable: %d with %d replicas: want 1..%d (%d would block every node drain)" $min $n (sub $n 1) $n) -}}
{{- end -}}
minAvailable: {{ $min }}
{{- end -}}
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
The controllers' configuration file (regional.Config), one for every
replica, without secrets: the admin token, gossip key and audit HMAC key
come from secrets.name through MERIDIAN_ADMIN_TOKEN, MERIDIAN_GOSSIP_KEY
and MERIDIAN_AUDIT_KEY; ${POD_INDEX} (the pod's ordinal) and ${POD_IP}
make each replica's controller id, certificate and advertised addresses.
Replica 0 of the region that bootstraps (raft.bootstrap) bootstraps the
Raft cluster (raft.bootstrap_id); every other replica joins, through its
own region's address first. The leader keeps one voter per region
(raft.voters_per_region, default 1): the other replicas replicate without
voting.
*/}}
{{- define "meridian.config" -}}
{{- $_ := include "meridian.replicas" . -}}
{{- $host := required "advertise.host is required: the DNS name other regions reach this region on" .Values.advertise.host -}}
{{- $p := .Values.ports -}}
{{- if not .Values.kafka.brokers -}}
{{- fail "kafka.brokers is required: this region's Kafka bootstrap servers" -}}
{{- end -}}
{{- $kafka := dict "brokers" .Values.kafka.brokers -}}
{{- with .Values.kafka.topic }}{{ $_ := set $kafka "topic" . }}{{ end -}}
{{- with .Values.kafka.tls }}{{ $_ := set $kafka "tls" . }}{{ end -}}
{{- if .Values.kafka.sasl.username }}{{ $_ := set $kafka "sasl" .Values.kafka.sasl }}{{ end -}}
{{- /* Where the other regions reach this replica: its pod IP, or (one replica) the WAN Service. */ -}}
{{- $self := "${POD_IP}" -}}
{{- $gossipAddr := printf "${POD_IP}:%v" $p.gossip -}}
{{- if eq .Values.advertise.replicaAddress "wanService" -}}
{{- $self = $host -}}
{{- $gossipAddr = required "advertise.gossipAddress is required with replicaAddress wanService: the IP:port other regions reach for gossip" .Values.advertise.gossipAddress -}}
{{- end -}}
{{- $gossip := dict "bind" (printf "0.0.0.0:%v" $p.gossip) "advertise" $gossipAddr "join" .Values.gossip.join -}}
{{- with .Values.gossip.staticRTT }}{{ $_ := set $gossip "static_rtt" . }}{{ end -}}
{{- /* Join through this region's address first (its other replicas), then the members named. */ -}}
{{- $regionAdmin := printf "https://%s:%v" $host $p.admin -}}
{{- $join := prepend (without .Values.raft.join $regionAdmin) $regionAdmin -}}
{{- $raft := dict "data_dir" "/var/lib/meridian/raft" "bind" (printf "0.0.0.0:%v" $p.raft) "advertise" (printf "%s:%v" $self $p.raft) "join" $join "voters" .Values.raft.voters "wan" .Values.raft.wan -}}
{{- if .Values.raft.bootstrap }}{{ $_ := set $raft "bootstrap_id" (printf "%s-0" (include "meridian.idPrefix" .)) }}{{ end -}}
{{- $cfg := dict
  "region" (include "meridian.region" .)
  "controller_id" (printf "%s-${POD_INDEX}" (include "meridian.idPrefix" .))
  "listen" (printf ":%v" $p.http)
  "admin_listen" (printf ":%v" $p.admin)
  "public_url" (printf "https://%s:%v" $host $p.http)
  "admin_url" (printf "https://%s:%v" $self $p.admin)
  "tls" (dict "cert" "/etc/meridian/tls/${POD_INDEX}/tls.crt" "key" "/etc/meridian/tls/${POD_INDEX}/tls.key" "client_ca" "/etc/meridian/tls/${POD_INDEX}/ca.crt")
  "auth" (dict "mode" "api_keys" "api_keys" (dict "file" "/etc/meridian/auth/api-keys.yaml"))
  "policy_file" "/etc/meridian/policy/residency-policy.yaml"
  "raft" $raft
  "gossip" $gossip
  "audit" (dict "dir" "/var/lib/meridian/audit")
  "auto_failover" (dict "enabled" .Values.autoFailover.enabled)
  "shutdown" (dict "drain_delay" "0s" "grace" (printf "%vs" (int .Values.shutdown.graceSeconds)))
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
