package enginesim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/segmentio/kafka-go"

	"github.com/meridian-llm/meridian/regional/kafkasec"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// Kafka message headers the engine simulator writes on every batch (their
// one definition is in regional/kvevents). The key is the pod name, so one
// pod's batches stay in order on one partition.
const (
	HeaderPod      = kvevents.HeaderPod
	HeaderModel    = kvevents.HeaderModel
	HeaderHardware = kvevents.HeaderHardware
	HeaderSeq      = kvevents.HeaderSeq
	HeaderEpoch    = kvevents.HeaderEpoch
)

// KVBatch converts b to the wire model of regional/kvevents as b.Engine's
// code writes it (an empty Engine is vLLM):
//
//   - vllm: BlockStored with medium "GPU", the LoRA name, and extra_keys per
//     block carrying the LoRA name and, on a chain's first block, the cache
//     salt (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys);
//   - sglang: no lora_name or extra_keys; a salted chain's events carry
//     cache_salt (its BlockStoredMetadata, PR 30827); a LoRA is a lora_id;
//   - trtllm: no lora_name, extra_keys or salt (its streaming events have
//     none, kv_cache_events.py); a LoRA is a lora_id.
//
// Meridian's PodUp (with the engine kind and the KV capacity) and PodDown
// are the same for all.
func (b Batch) KVBatch() kvevents.Batch {
	out := kvevents.Batch{
		TS:               float64(b.TS.UnixNano()) / 1e9,
		DataParallelRank: kvevents.Some(int64(b.DPRank)),
		Events:           make([]kvevents.Event, 0, len(b.Events)),
	}
	for _, ev := range b.Events {
		switch ev.Kind {
		case BlockStored:
			s := &kvevents.BlockStored{
				BlockHashes: ev.BlockHashes,
				TokenIDs:    ev.TokenIDs,
				BlockSize:   int64(ev.BlockSize),
				Medium:      kvevents.Some(ev.Medium),
			}
			if ev.HasParent {
				s.ParentBlockHash = kvevents.Some(ev.ParentHash)
			}
			switch b.Engine {
			case kvevents.EngineSGLang, kvevents.EngineTRTLLM:
				if ev.LoRAName != "" {
					s.LoRAID = kvevents.Some(loraID(ev.LoRAName))
				}
				if b.Engine == kvevents.EngineSGLang && ev.CacheSalt != "" {
					s.CacheSalt = kvevents.Some(ev.CacheSalt)
				}
			default:
				vllmKeys(s, ev)
			}
			out.Events = append(out.Events, s)
		case BlockRemoved:
			out.Events = append(out.Events, &kvevents.BlockRemoved{BlockHashes: ev.BlockHashes, Medium: kvevents.Some(ev.Medium)})
		case AllBlocksCleared:
			out.Events = append(out.Events, &kvevents.AllBlocksCleared{})
		case PodUp:
			p := ev.Pod
			out.Events = append(out.Events, &kvevents.PodUp{Pod: p.Name, Endpoint: p.Endpoint, Model: p.Model,
				Hardware: p.Hardware, Region: p.Region, Epoch: p.Epoch, Engine: p.Engine, KVBlocks: p.KVBlocks, TTL: p.TTL})
		case PodDown:
			out.Events = append(out.Events, &kvevents.PodDown{Pod: ev.Pod.Name, Epoch: ev.Pod.Epoch, Reason: ev.Pod.Reason})
		}
	}
	return out
}

// vllmKeys sets vLLM's LoRA name and per-block extra keys (the LoRA name on
// every block, the cache salt on a chain's first).
func vllmKeys(s *kvevents.BlockStored, ev Event) {
	if ev.LoRAName != "" {
		s.LoRAName = kvevents.Some(ev.LoRAName)
	}
	if ev.LoRAName == "" && (ev.CacheSalt == "" || ev.HasParent) {
		return
	}
	s.ExtraKeys = make([]kvevents.Raw, len(ev.BlockHashes))
	for i := range s.ExtraKeys {
		var keys []string
		if ev.LoRAName != "" {
			keys = append(keys, ev.LoRAName)
		}
		if i == 0 && !ev.HasParent && ev.CacheSalt != "" {
			keys = append(keys, ev.CacheSalt)
		}
		s.ExtraKeys[i] = kvevents.RawStrings(keys)
	}
}

// loraID is the integer id SGLang and TensorRT-LLM announce for an adapter
// (they send no name): a stable number per name.
func loraID(name string) int64 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int64(h.Sum32())
}

// EncodingFor is the payload encoding of an engine kind: the array envelope
// every engine writes, map events (vLLM since PR 42892, SGLang since PR
// 37482, TensorRT-LLM's streaming publisher), and signed hashes for SGLang
// (hash_str_to_int64).
func EncodingFor(engine string) kvevents.Encoding {
	enc := kvevents.Encoding{Events: kvevents.EventsMap}
	if engine == kvevents.EngineSGLang {
		enc.Hashes = kvevents.HashInt
	}
	return enc
}

// KafkaPublisher writes each batch as one Kafka message: value = the
// KVEventBatch in msgpack as the pod's engine writes it (EncodingFor), key =
// pod name, headers pod/model/hardware/engine/kv-blocks/seq/epoch.
// It uses its own kafka-go Transport (closed with it), with the TLS and
// SASL of cfg.Security, and a Hash balancer with RequireAll acks.
type KafkaPublisher struct {
	w       *kafka.Writer
	tr      *kafka.Transport
	sec     *kafkasec.Client
	key     []byte
	headers []kafka.Header
	enc     kvevents.Encoding
	buf     []byte
}

// NewKafkaPublisher returns a publisher for pod's batches. Close it.
func NewKafkaPublisher(cfg KafkaConfig, pod PodInfo) (*KafkaPublisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("new kafka publisher: no brokers")
	}
	if cfg.Topic == "" {
		return nil, errors.New("new kafka publisher: no topic")
	}
	if err := cfg.Security.Validate("kafka", cfg.Brokers, cfg.Insecure); err != nil {
		return nil, fmt.Errorf("new kafka publisher: %w", err)
	}
	sec, err := cfg.Security.Open("kafka", nil)
	if err != nil {
		return nil, fmt.Errorf("new kafka publisher: %w", err)
	}
	tr := sec.Transport("meridian-enginesim-"+pod.Name, 0)
	w := &kafka.Writer{
		Addr:                   kafka.TCP(cfg.Brokers...),
		Topic:                  cfg.Topic,
		Balancer:               &kafka.Hash{},
		RequiredAcks:           kafka.RequireAll,
		BatchTimeout:           cfg.BatchTimeout,
		WriteTimeout:           cfg.WriteTimeout,
		AllowAutoTopicCreation: true,
		Transport:              tr,
	}
	return &KafkaPublisher{
		w: w, tr: tr, sec: sec, key: []byte(pod.Name),
		headers: []kafka.Header{
			{Key: HeaderPod, Value: []byte(pod.Name)},
			{Key: HeaderModel, Value: []byte(pod.Model)},
			{Key: HeaderHardware, Value: []byte(pod.Hardware)},
			{Key: kvevents.HeaderEngine, Value: []byte(pod.Engine)},
			{Key: kvevents.HeaderKVBlocks, Value: binary.BigEndian.AppendUint64(nil, pod.KVBlocks)},
		},
		enc: EncodingFor(pod.Engine),
	}, nil
}

// Publish implements Publisher. It is not safe for concurrent use (the
// engine's event pipe calls it from one goroutine).
func (p *KafkaPublisher) Publish(ctx context.Context, b Batch) error {
	kb := b.KVBatch()
	var err error
	if p.buf, err = p.enc.AppendBatch(p.buf[:0], &kb); err != nil {
		return fmt.Errorf("publish kv events: %w", err)
	}
	headers := append(slices.Clip(p.headers),
		kafka.Header{Key: HeaderSeq, Value: binary.BigEndian.AppendUint64(nil, b.Seq)},
		kafka.Header{Key: HeaderEpoch, Value: binary.BigEndian.AppendUint64(nil, b.Epoch)})
	msg := kafka.Message{Key: p.key, Value: slices.Clone(p.buf), Headers: headers}
	if err := p.w.WriteMessages(ctx, msg); err != nil {
		return fmt.Errorf("publish kv events to %s: %w", p.w.Topic, p.sec.Explain(err))
	}
	return nil
}

// Close flushes and closes the writer and its transport's connections.
func (p *KafkaPublisher) Close() error {
	err := p.w.Close()
	p.tr.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("close kafka publisher: %w", err)
	}
	return nil
}
