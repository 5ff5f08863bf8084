package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/regional/kafkasec"
	"github.com/meridian-llm/meridian/regional/kvevents"
)

// eventsTailCommand is `meridian events tail`: decode a topic live.
func eventsTailCommand() *cli.Command {
	return &cli.Command{
		Name:  "tail",
		Usage: "follow a KV-event topic and print each message as one JSON object per line",
		Description: "Joins the topic with a consumer group of its own (it never moves the controllers'\n" +
			"offsets), from the end of the topic or with --from-beginning from its start, and prints\n" +
			"partition, offset, key, headers and the decoded batch of every message. A message that\n" +
			"cannot be decoded is printed with its error (byte offset and reason) and tailing goes on.\n" +
			"The --kafka-* flags reach brokers that require TLS and SASL, as a controller's kafka section does.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "kafka", EnvVars: []string{"MERIDIAN_KAFKA"}, Usage: "comma-separated Kafka brokers (required)"},
			&cli.StringFlag{Name: "topic", Usage: "topic, e.g. meridian.kv-events.us-east-1 (required)"},
			&cli.BoolFlag{Name: "from-beginning", Usage: "start from the oldest retained message"},
			&cli.IntFlag{Name: "max", Usage: "stop after this many messages (0: until interrupted)"},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "give up if no broker answers for the topic within this long (tailing itself runs until --max or interrupted)"},
		}, kafkaSecurityFlags()...),
		Action: func(c *cli.Context) error {
			if c.String("kafka") == "" || c.String("topic") == "" {
				return usageError("events tail: --kafka (or MERIDIAN_KAFKA) and --topic are required")
			}
			start := kafka.LastOffset
			if c.Bool("from-beginning") {
				start = kafka.FirstOffset
			}
			brokers := strings.Split(c.String("kafka"), ",")
			sec := kafkaSecurity(c, kafkasec.Config{})
			if err := sec.Validate("kafka", brokers, c.Bool("kafka-insecure")); err != nil {
				return usageError("events tail: %w", err)
			}
			client, err := sec.Open("kafka", nil)
			if err != nil {
				return usageError("events tail: %w", err)
			}
			timeout := c.Duration("timeout")
			if timeout <= 0 {
				return usageError("events tail: --timeout = %v: want > 0", timeout)
			}
			dialer := client.Dialer(timeout)
			// Ask for the topic first: a consumer group against brokers that
			// do not answer retries quietly for ever, and the operator would
			// see nothing at all.
			if err := probeTopic(c.Context, dialer, brokers, c.String("topic"), timeout); err != nil {
				return fmt.Errorf("events tail: %w", client.Explain(err))
			}
			r := kafka.NewReader(kafka.ReaderConfig{
				Dialer:      dialer,
				Brokers:     brokers,
				Topic:       c.String("topic"),
				GroupID:     "meridian-events-tail-" + strconv.FormatInt(time.Now().UnixNano(), 36),
				StartOffset: start,
				MinBytes:    1,
				MaxBytes:    32 << 20,
				MaxWait:     200 * time.Millisecond,
			})
			defer r.Close()
			dec, err := kvevents.NewDecoder(kvevents.DefaultDecoderConfig())
			if err != nil {
				return err
			}
			for n := 0; c.Int("max") == 0 || n < c.Int("max"); n++ {
				m, err := r.ReadMessage(c.Context)
				if err != nil {
					if c.Context.Err() != nil {
						return nil
					}
					return fmt.Errorf("events tail: %w", client.Explain(err))
				}
				line, err := tailLine(dec, m)
				if err != nil {
					return err
				}
				if _, err := c.App.Writer.Write(line); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// probeTopic asks the brokers, one after another, for the topic's
// partitions, all within timeout: nil once one names at least one.
func probeTopic(ctx context.Context, d *kafka.Dialer, brokers []string, topic string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for _, b := range brokers {
		conn, err := d.DialContext(ctx, "tcp", b)
		if err != nil {
			last = err
			continue
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = conn.SetDeadline(dl)
		}
		parts, err := conn.ReadPartitions(topic)
		conn.Close()
		switch {
		case err != nil:
			last = err
		case len(parts) == 0:
			return fmt.Errorf("topic %q has no partitions on %s", topic, b)
		default:
			return nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("no broker of %s answered for topic %q within %v (last: %w)", strings.Join(brokers, ","), topic, timeout, last)
}

// tailLine renders one Kafka message: its position, key, headers and decoded
// batch (or the decode error).
func tailLine(dec *kvevents.Decoder, m kafka.Message) ([]byte, error) {
	headers := map[string]any{}
	for _, h := range m.Headers {
		if (h.Key == kvevents.HeaderSeq || h.Key == kvevents.HeaderEpoch) && len(h.Value) == 8 {
			headers[h.Key] = binary.BigEndian.Uint64(h.Value)
		} else {
			headers[h.Key] = string(h.Value)
		}
	}
	head := map[string]any{"partition": m.Partition, "offset": m.Offset, "key": string(m.Key), "headers": headers, "time": m.Time}
	b, err := json.Marshal(head)
	if err != nil {
		return nil, err
	}
	b = b[:len(b)-1] // reopen the object
	batch, derr := dec.Decode(m.Value)
	if derr != nil {
		var de *kvevents.DecodeError
		e, _ := json.Marshal(derr.Error())
		b = append(b, `,"error":`...)
		b = append(b, e...)
		if errors.As(derr, &de) {
			b = append(b, `,"reason":"`...)
			b = append(b, de.Reason...)
			b = append(b, '"')
		}
	} else {
		b = append(b, `,"batch":`...)
		b = kvevents.AppendJSON(b, batch)
	}
	return append(b, '}', '\n'), nil
}
