package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/meridian-llm/meridian/regional/kvbridge"
	"github.com/meridian-llm/meridian/regional/kvevents"
	"github.com/meridian-llm/meridian/scenarios/enginesim"
)

func TestKVBridgeCheck(t *testing.T) {
	out, _, err := runApp(t, "kv-bridge", "--kafka", "127.0.0.1:9092", "--region", "r",
		"--pod", "pod-a=tcp://10.0.0.7:5557,replay=tcp://10.0.0.7:5558,hardware=h100",
		"--pod", "tcp://*:5600,bind", "--check")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"topic: meridian.kv-events.r", "name: pod-a", "endpoint: tcp://10.0.0.7:5557",
		"replay_endpoint: tcp://10.0.0.7:5558", "hardware: h100", "endpoint: tcp://*:5600", "bind: true", "replay_timeout: 5s"} {
		if !strings.Contains(out, want) {
			t.Errorf("effective config lacks %q:\n%s", want, out)
		}
	}
	// A file, with flags adding pods and overriding the region.
	dir := t.TempDir()
	path := filepath.Join(dir, "bridge.yaml")
	os.WriteFile(path, []byte("region: us-east-1\nbrokers: [127.0.0.1:9092]\npods:\n  - name: f\n    endpoint: tcp://10.0.0.9:5557\n"), 0o644)
	out, _, err = runApp(t, "kv-bridge", "--config", path, "--region", "eu-west-1", "--pod", "g=tcp://10.0.0.10:5557", "--check")
	if err != nil || !strings.Contains(out, "topic: meridian.kv-events.eu-west-1") || !strings.Contains(out, "name: f") || !strings.Contains(out, "name: g") {
		t.Fatalf("file + flags: %v\n%s", err, out)
	}
}

func TestKVBridgeUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"--kafka", "127.0.0.1:9092", "--region", "r"}, "pods: at least one", 2},
		{[]string{"--region", "r", "--pod", "a=tcp://h:1"}, "brokers", 2},
		{[]string{"--kafka", "127.0.0.1:9092", "--region", "r", "--pod", "a=udp://h:1"}, "pods[0].endpoint", 2},
		{[]string{"--kafka", "127.0.0.1:9092", "--region", "r", "--pod", "a=tcp://h:1,colour=red"}, "unknown option", 2},
		{[]string{"--config", "/nonexistent.yaml"}, "nonexistent", 2},
	} {
		_, _, err := runApp(t, append([]string{"kv-bridge"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) || exitCode(err) != c.code {
			t.Errorf("%v: error %v (exit %d), want %q (exit %d)", c.args, err, exitCode(err), c.want, c.code)
		}
	}
}

// The command forwards an engine's ZMQ batches to Kafka and stops cleanly
// when its context ends.
func TestKVBridgeRuns(t *testing.T) {
	const topic = "meridian.kv-events.cmd"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	pub, err := enginesim.NewZMQPublisher(enginesim.ZMQConfig{Endpoint: "tcp://127.0.0.1:0", Mode: "bind",
		ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@pod-c@m"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	app := newApp()
	var errOut bytes.Buffer
	app.Writer, app.ErrWriter = &bytes.Buffer{}, &errOut
	done := make(chan error, 1)
	go func() {
		done <- app.RunContext(ctx, []string{"meridian", "kv-bridge", "--kafka", strings.Join(cluster.ListenAddrs(), ","),
			"--region", "cmd", "--pod", "=" + pub.Addr() + ",replay=" + pub.ReplayAddr(), "--log-level", "warn"})
	}()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := pub.WaitFor(wctx, func(s enginesim.ZMQStats) bool { return s.Subscribers == 1 }); err != nil {
		t.Fatal(err)
	}
	for s := range uint64(3) {
		if err := pub.Publish(ctx, enginesim.Batch{Pod: "pod-c", Seq: s, TS: time.Unix(1, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: cluster.ListenAddrs(), Topic: topic, Partition: 0, MaxWait: 50 * time.Millisecond})
	defer r.Close()
	var got []string
	for len(got) < 4 {
		m, err := r.ReadMessage(wctx)
		if err != nil {
			t.Fatalf("read: %v (stderr %s)", err, errOut.String())
		}
		desc := string(m.Key) + ":"
		for _, h := range m.Headers {
			switch h.Key {
			case kvevents.HeaderSeq:
				desc += string(rune('0' + binary.BigEndian.Uint64(h.Value)))
			case kvbridge.HeaderMarker:
				desc += "M"
			}
		}
		got = append(got, desc)
	}
	if strings.Join(got, " ") != "pod-c:M pod-c:0 pod-c:1 pod-c:2" {
		t.Fatalf("kafka holds %v", got)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("kv-bridge: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("kv-bridge did not stop")
	}
}
