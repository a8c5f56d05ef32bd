// saramatool drives gregor with Sarama 1.22 (Debian's golang-github-shopify-sarama-dev), the
// client library of Burrow and of many Go services of the ZooKeeper era.
//
//	saramatool -brokers H:P -version 2.0.0 produce  -topic T -n N [-codec gzip]
//	saramatool -brokers H:P -version 2.0.0 consume  -topic T -group G -n N
//	saramatool -brokers H:P -version 2.0.0 offsets  -topic T -group G
//
// produce prints one "partition offset key" line per acknowledged record; consume joins the
// group, reads until it has N records (oldest first), marks them and exits after the session's
// final commit, printing "partition offset key value" lines; offsets prints the group's
// committed offset of each partition as Sarama's OffsetManager reads it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/Shopify/sarama"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "saramatool: "+format+"\n", args...)
	os.Exit(1)
}

type handler struct {
	want    int
	mu      sync.Mutex
	got     []string
	done    chan struct{}
	closing sync.Once
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		h.mu.Lock()
		if len(h.got) < h.want {
			h.got = append(h.got, fmt.Sprintf("%d %d %s %s", msg.Partition, msg.Offset, msg.Key, msg.Value))
			sess.MarkMessage(msg, "")
		}
		full := len(h.got) >= h.want
		h.mu.Unlock()
		if full {
			h.closing.Do(func() { close(h.done) })
		}
	}
	return nil
}

func main() {
	brokers := flag.String("brokers", "", "bootstrap host:port")
	version := flag.String("version", "2.0.0", "Kafka version Sarama speaks")
	flag.Parse()
	if flag.NArg() < 1 {
		fail("command missing (produce, consume, offsets)")
	}
	v, err := sarama.ParseKafkaVersion(*version)
	if err != nil {
		fail("version %q: %v", *version, err)
	}
	sub := flag.NewFlagSet(flag.Arg(0), flag.ExitOnError)
	topic := sub.String("topic", "", "topic")
	group := sub.String("group", "", "consumer group")
	n := sub.Int("n", 100, "records")
	codec := sub.String("codec", "none", "none, gzip, snappy, lz4")
	timeout := sub.Duration("timeout", 60*time.Second, "give up after")
	if err := sub.Parse(flag.Args()[1:]); err != nil {
		fail("%v", err)
	}

	cfg := sarama.NewConfig()
	cfg.Version = v
	cfg.ClientID = "saramatool"
	cfg.Metadata.Retry.Max = 20
	cfg.Metadata.Retry.Backoff = 250 * time.Millisecond
	addrs := []string{*brokers}

	switch flag.Arg(0) {
	case "produce":
		cfg.Producer.Return.Successes = true
		cfg.Producer.RequiredAcks = sarama.WaitForAll
		cfg.Producer.Retry.Max = 20
		cfg.Producer.Retry.Backoff = 250 * time.Millisecond
		switch *codec {
		case "none":
		case "gzip":
			cfg.Producer.Compression = sarama.CompressionGZIP
		case "snappy":
			cfg.Producer.Compression = sarama.CompressionSnappy
		case "lz4":
			cfg.Producer.Compression = sarama.CompressionLZ4
		default:
			fail("codec %q", *codec)
		}
		p, err := sarama.NewSyncProducer(addrs, cfg)
		if err != nil {
			fail("producer: %v", err)
		}
		msgs := make([]*sarama.ProducerMessage, *n)
		for i := range msgs {
			msgs[i] = &sarama.ProducerMessage{
				Topic: *topic,
				Key:   sarama.StringEncoder(fmt.Sprintf("k%d", i)),
				Value: sarama.StringEncoder(fmt.Sprintf("sarama-%s-%d", *version, i)),
			}
		}
		if err := p.SendMessages(msgs); err != nil {
			fail("send: %v", err)
		}
		for _, m := range msgs {
			fmt.Printf("%d %d %s\n", m.Partition, m.Offset, m.Key)
		}
		if err := p.Close(); err != nil {
			fail("close: %v", err)
		}
	case "consume":
		cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
		cfg.Consumer.Offsets.CommitInterval = 200 * time.Millisecond
		cfg.Consumer.Return.Errors = false
		cg, err := sarama.NewConsumerGroup(addrs, *group, cfg)
		if err != nil {
			fail("consumer group: %v", err)
		}
		h := &handler{want: *n, done: make(chan struct{})}
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		go func() {
			select {
			case <-h.done:
			case <-ctx.Done():
			}
			cancel()
		}()
		for ctx.Err() == nil {
			if err := cg.Consume(ctx, []string{*topic}, h); err != nil && ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "saramatool: consume: %v (retrying)\n", err)
				time.Sleep(200 * time.Millisecond)
			}
		}
		// Close waits for the session's final offset commit.
		if err := cg.Close(); err != nil {
			fail("close: %v", err)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.got) < h.want {
			fail("read %d of %d records before the timeout", len(h.got), h.want)
		}
		for _, line := range h.got {
			fmt.Println(line)
		}
	case "offsets":
		client, err := sarama.NewClient(addrs, cfg)
		if err != nil {
			fail("client: %v", err)
		}
		om, err := sarama.NewOffsetManagerFromClient(*group, client)
		if err != nil {
			fail("offset manager: %v", err)
		}
		parts, err := client.Partitions(*topic)
		if err != nil {
			fail("partitions: %v", err)
		}
		sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
		for _, p := range parts {
			pom, err := om.ManagePartition(*topic, p)
			if err != nil {
				fail("partition %d: %v", p, err)
			}
			off, _ := pom.NextOffset()
			fmt.Printf("%d %d\n", p, off)
			pom.AsyncClose()
		}
		om.Close()
		client.Close()
	default:
		fail("unknown command %q", flag.Arg(0))
	}
}
