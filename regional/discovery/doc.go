// Package discovery finds a region's inference pods without static lists:
// by following a Kubernetes headless Service through DNS, or a file of
// pods. Its one job: turn lookups into a stream of snapshots of the current
// pods, each pod with its HTTP endpoint and, for the KV-event bridge, its
// engine's ZMQ endpoints. What to do with a pod is its consumers' business:
// the controller's registry and `meridian kv-bridge`.
//
// # Sources
//
// A Source runs as one goroutine, its caller's, in Run(ctx, update): it
// calls update with the first successful answer and then with every
// changed set, each a sorted slice the callee may keep; Diff says who
// joined, changed or left. Refresh(ctx) asks the running source to look up
// now and returns the lookup's error.
//
//   - DNS asks for SRV records _<service>._<proto>.<name> (Kubernetes
//     publishes one per ready pod of a headless Service: target
//     <pod>.<service>.<ns>.svc.cluster.local and the named port) and
//     resolves each target; or, with lookup ip, for the A/AAAA records of
//     <name> with a configured port. Pods are named <name_prefix>-<ip with
//     dashes> (vllm-10-0-3-7, vllm-fd00--3-7) whatever the record type, so
//     two processes that follow the same Service name pods alike, and a pod
//     that Kubernetes replaces (a new IP) is a new pod; name_from target
//     takes the SRV target's first label instead (a StatefulSet's vllm-0).
//     The endpoint is <scheme>://<ip>:<port>; with kv_events_port and
//     replay_port the pod also carries tcp://<ip>:<port> for each.
//   - File reads a YAML or JSON document, either a list of pods or a
//     mapping {pods: [...]}, each pod {name, endpoint, model, profile,
//     kv_events, replay} (name and endpoint required). It checks the file's
//     identity, size and modification time every interval and re-reads it
//     when one changed, or on Refresh. Write it by renaming a complete file
//     into place (as Kubernetes updates a mounted ConfigMap).
//
// # Invariants
//
//   - A failed lookup (timeout, SERVFAIL, refused; an unreadable, empty or
//     invalid file) changes nothing: the last good set stands, the failure
//     is counted (meridian_discovery_lookups_total{result="error"}) and
//     logged once per distinct error. NXDOMAIN or no records is an answer
//     of zero pods (result not_found): Kubernetes' DNS answers one of them
//     for a Service with no ready pod.
//   - A pod that a DNS answer lacks is kept until it has been missing from
//     drop_after_misses consecutive answers (default 2) and for grace
//     (default 30s) since the first of them: readiness flaps and answers
//     from lagging DNS replicas do not drop it, and dropping a pod costs a
//     controller its index of the pod's cache. Failed lookups are not
//     answers, so an outage of DNS drops nothing, and the first answer after
//     it can drop nothing either. A pod the file no longer lists leaves at
//     once: the file is written on purpose.
//   - DNS lookups come every interval (default 5s) or, when the answer's
//     shortest TTL is shorter, when it runs out, but never more often than
//     min_interval (default 1s). net.Resolver does not return TTLs: the
//     source reads them from the responses on the connections it dials for
//     the resolver (ttl.go). After a failure the delay doubles from
//     min_interval up to interval.
//
// The keep-or-drop rule is a pure state machine (tracker) fed answers and
// their arrival times from an injected clock; the loop that owns the timer,
// the resolver and the file is shared by both sources.
//
// # Use by the controller and the bridge
//
// The controller reads the section under pods.discovery. It runs the
// source beside its ingester and applies each snapshot's Diff to its
// registry: Upsert(route.PodInfo{Name, Endpoint, Model, Profile}) for
// joined and changed pods, Remove for pods that left (static pods stay).
// Where the bridge also follows the Service and announces the engines,
// give both the same dns section: a PodUp then names the same pod with the
// same endpoint.
//
//	pods:
//	  discovery:
//	    dns:
//	      name: vllm.inference.svc.cluster.local.  # the headless Service
//	      lookup: srv            # srv (default): _http._tcp.<name>; ip: A/AAAA + port
//	      service: http          # the Service's port name (default http)
//	      proto: tcp             # default tcp
//	      # port: 8000           # lookup ip only
//	      network: ip            # ip (default), ip4 or ip6
//	      scheme: http           # of the pods' endpoints (default http)
//	      # server: 10.96.0.10:53  # default: /etc/resolv.conf
//	      interval: 5s           # longest time between lookups
//	      min_interval: 1s       # shortest (TTLs in between are honoured)
//	      timeout: 2s            # one lookup
//	      grace: 30s             # a missing pod is kept this long ...
//	      drop_after_misses: 2   # ... and for this many answers
//	      name_from: ip          # ip: <name_prefix>-10-0-3-7; target: SRV target's label
//	      # name_prefix: vllm    # default: the first label of name
//	      model: meta-llama/Llama-3.1-8B-Instruct
//	      profile: h100
//	    # or, instead of dns:
//	    # file:
//	    #   path: /etc/meridian/pods.yaml
//	    #   interval: 5s
//	    #   model: meta-llama/Llama-3.1-8B-Instruct
//	    #   profile: h100
//
// The bridge reads the same section under discovery, with the engines'
// ZMQ ports. It subscribes to Pod.KVEvents (replay socket Pod.Replay) of
// each pod that joins, under Pod.Name, publishes a PodUp for it with
// Pod.Endpoint, Model and Profile (hardware), and unsubscribes from pods
// that leave. For the controller and the bridge to agree on names, give
// both the same name, name_from and name_prefix.
//
//	discovery:
//	  dns:
//	    name: vllm.inference.svc.cluster.local.
//	    service: http
//	    kv_events_port: 5557   # vLLM's kv_events_config endpoint port
//	    replay_port: 5558      # its replay_endpoint port (0: none)
//	    model: meta-llama/Llama-3.1-8B-Instruct
//	    profile: h100
//
// Test servers: regional/discovery/discoverytest answers like CoreDNS for
// headless Services, on loopback, and lets a test change the records while
// a source runs.
//
// It imports nothing of Meridian's (Pod is its own type, not
// route.PodInfo: the bridge consumes it too and must not pull in the
// decision core, and a pod here carries its address and ZMQ endpoints,
// which the registry has no use for). It must not import regional, Kafka
// clients, or Prometheus beyond the Registerer it is given.
package discovery
