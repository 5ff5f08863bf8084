package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/regional/kvevents"
)

func TestEventsTail(t *testing.T) {
	cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(cl.ListenAddrs()...), Topic: "meridian.kv-events.t", Transport: tr,
		Balancer: &kafka.Hash{}, BatchTimeout: time.Millisecond, AllowAutoTopicCreation: true}
	defer w.Close()
	good, err := kvevents.Encoding{}.AppendBatch(nil, &kvevents.Batch{TS: 1, Events: []kvevents.Event{
		&kvevents.BlockRemoved{BlockHashes: []uint64{7}, Medium: kvevents.Some("GPU")}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err = w.WriteMessages(ctx,
			kafka.Message{Key: []byte("pod-a"), Value: good, Headers: []kafka.Header{{Key: kvevents.HeaderSeq, Value: binary.BigEndian.AppendUint64(nil, 3)}}},
			kafka.Message{Key: []byte("pod-a"), Value: []byte{0x93, 0xcb}})
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	app := newApp()
	var out strings.Builder
	app.Writer = &out
	if err := app.RunContext(ctx, []string{"meridian", "events", "tail", "--kafka", strings.Join(cl.ListenAddrs(), ","),
		"--topic", "meridian.kv-events.t", "--from-beginning", "--max", "2"}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %q", out.String())
	}
	var first, second map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatalf("line 1 not JSON: %v: %s", err, lines[0])
	}
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil {
		t.Fatalf("line 2 not JSON: %v: %s", err, lines[1])
	}
	if first["key"] != "pod-a" || first["batch"] == nil || first["headers"].(map[string]any)["seq"] != 3.0 {
		t.Fatalf("good message: %s", lines[0])
	}
	if second["reason"] != "truncated" || !strings.Contains(second["error"].(string), "byte") {
		t.Fatalf("bad message: %s", lines[1])
	}
}

// TestEventsTailSilentBroker: against an address that accepts connections
// and never answers, `events tail` gives up after --timeout with an error
// naming the brokers and the topic, instead of waiting for ever.
func TestEventsTailSilentBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn // open, never answered, closed with the listener
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	app := newApp()
	app.Writer = io.Discard
	err = app.RunContext(ctx, []string{"meridian", "events", "tail", "--kafka", ln.Addr().String(), "--topic", "meridian.kv-events.t",
		"--kafka-insecure", "--timeout", "300ms"})
	if err == nil || ctx.Err() != nil {
		t.Fatalf("tail against a silent broker: err %v, test context %v", err, ctx.Err())
	}
	if msg := err.Error(); !strings.Contains(msg, "no broker of "+ln.Addr().String()+` answered for topic "meridian.kv-events.t" within 300ms`) {
		t.Fatalf("error does not say what failed: %s", msg)
	}
	if code := exitCode(err); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
}
