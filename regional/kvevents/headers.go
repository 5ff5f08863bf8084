package kvevents

// Kafka message headers of the region topic. The key of every message is the
// pod name (so each pod's events stay ordered in one partition); producers
// (the engine simulator, the ZMQ bridge) add these headers where they know
// the values, and the ingester reads them.
const (
	HeaderPod      = "pod"       // pod name (same as the key)
	HeaderModel    = "model"     // served model name
	HeaderHardware = "hardware"  // hardware profile, e.g. "h100"
	HeaderSeq      = "seq"       // batch sequence number, 8 bytes big-endian (vLLM's ZMQ frame 1)
	HeaderEpoch    = "epoch"     // producer process-start epoch, 8 bytes big-endian
	HeaderEngine   = "engine"    // engine kind: vllm, sglang or trtllm (see Engines)
	HeaderKVBlocks = "kv-blocks" // KV-cache capacity in engine blocks, 8 bytes big-endian
	// HeaderMarker marks a batch the ZMQ bridge writes itself ("restart" or
	// "join": an AllBlocksCleared for a rank whose engine restarted or
	// whose history is unknown); it carries no seq, and the rank's sequence
	// numbering starts afresh after it.
	HeaderMarker = "kvbridge-marker"
)

// TopicFor is the default Kafka topic of a region's KV events,
// "meridian.kv-events.<region>": the ingester reads it, the engine simulator
// and the ZMQ bridge write to it.
func TopicFor(region string) string { return "meridian.kv-events." + region }
