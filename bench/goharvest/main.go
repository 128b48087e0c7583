// Command goharvest-bench drains a goharvest outbox table with goharvest itself (imported as a Go
// module, not copied) and prints one JSON line: rows, seconds, rows_per_s.
//
// It exists so that bench/bench_goharvest.py can put the Python relay side by side with the
// implementation it follows, on the same Postgres, the same Kafka broker and the same backlog.
//
//	HARVEST_DATA_SOURCE='host=... password=...' goharvest-bench -bootstrap 127.0.0.1:9092 -table bench.outbox
//
// The DSN comes from -dsn or, preferably, from $HARVEST_DATA_SOURCE: a command line is visible
// to every user through ps, an environment is not.
//
// Invariants:
//   - goharvest runs with its own defaults unless -mark-query-records / -max-in-flight-records
//     (or the other limit flags) are given a positive value: zero means "goharvest's default";
//   - the NELI leader topic exists before goharvest starts: brokers with auto topic creation
//     off (Kafka 4 in KRaft mode, as the project runs it) would otherwise never elect a leader;
//   - the clock starts when this process is elected leader and stops when the outbox is empty,
//     the same window bench/bench_relay.py times for the Python relay;
//   - nothing is printed to stdout but the final JSON document; logs go to stderr.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"regexp"
	"sync/atomic"
	"syscall"
	"time"

	_ "github.com/lib/pq" // the "postgres" database/sql driver, the one goharvest itself uses
	"github.com/obsidiandynamics/goharvest"
	"github.com/obsidiandynamics/libstdgo/scribe"
	"gopkg.in/confluentinc/confluent-kafka-go.v1/kafka"
)

type result struct {
	Rows             int64          `json:"rows"`
	Seconds          float64        `json:"seconds"`
	RowsPerS         float64        `json:"rows_per_s"`
	ElectionSeconds  float64        `json:"election_seconds"`
	Limits           map[string]int `json:"limits"`
	LimitsAreDefault bool           `json:"limits_are_default"`
	Goharvest        string         `json:"goharvest"`
	LeaderTopic      string         `json:"leader_topic"`
}

// A plain or schema-qualified Postgres identifier. goharvest splices the table name into its SQL
// as is, so anything else is refused here rather than handed to it.
var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

// goneli's own rule for group and topic names.
var kafkaName = regexp.MustCompile(`^[a-zA-Z0-9\._\-]+$`)

func main() {
	if err := run(); err != nil {
		log.SetFlags(0)
		log.Printf("goharvest-bench: %v", err)
		os.Exit(2)
	}
}

func run() error {
	dsn := flag.String("dsn", "", "Postgres DSN (lib/pq syntax); default $HARVEST_DATA_SOURCE")
	bootstrap := flag.String("bootstrap", "", "Kafka bootstrap servers, host:port[,host:port]")
	table := flag.String("table", "outbox", "outbox table, 'table' or 'schema.table' (goharvest's schema)")
	group := flag.String("leader-group", "goharvest-bench", "NELI leader group id")
	leaderTopic := flag.String("leader-topic", "", "NELI leader topic (default <leader-group>.neli, goneli's default)")
	replication := flag.Int("leader-topic-replication", -1, "replication factor when creating the leader topic (-1: the broker's default)")
	markQuery := flag.Int("mark-query-records", 0, "goharvest limits.markQueryRecords (0: goharvest's default, 100)")
	maxInFlight := flag.Int("max-in-flight-records", 0, "goharvest limits.maxInFlightRecords (0: goharvest's default, 1000)")
	sendConcurrency := flag.Int("send-concurrency", 0, "goharvest limits.sendConcurrency (0: goharvest's default, 8)")
	timeout := flag.Duration("timeout", 10*time.Minute, "give up when the outbox is not empty after this long")
	verbose := flag.Bool("v", false, "goharvest's info logs on stderr")
	flag.Parse()

	if *dsn == "" {
		*dsn = os.Getenv("HARVEST_DATA_SOURCE")
	}
	switch {
	case *dsn == "":
		return errors.New("-dsn: no Postgres DSN; fix: set HARVEST_DATA_SOURCE or pass -dsn")
	case *bootstrap == "":
		return errors.New("-bootstrap: empty; fix: pass the Kafka bootstrap servers, e.g. -bootstrap 127.0.0.1:9092")
	case !tableName.MatchString(*table):
		return fmt.Errorf("-table: %q is not a plain 'table' or 'schema.table' identifier; fix: rename it (goharvest splices it into SQL unquoted)", *table)
	case !kafkaName.MatchString(*group):
		return fmt.Errorf("-leader-group: %q has characters outside [a-zA-Z0-9._-]; fix: choose another name", *group)
	case *markQuery < 0 || *maxInFlight < 0 || *sendConcurrency < 0:
		return errors.New("-mark-query-records, -max-in-flight-records, -send-concurrency: must be >= 0 (0: goharvest's default)")
	}
	if *leaderTopic == "" {
		*leaderTopic = *group + ".neli"
	}
	if !kafkaName.MatchString(*leaderTopic) {
		return fmt.Errorf("-leader-topic: %q has characters outside [a-zA-Z0-9._-]; fix: choose another name", *leaderTopic)
	}

	db, err := sql.Open("postgres", *dsn)
	if err != nil {
		return fmt.Errorf("cannot open Postgres: %w", err)
	}
	defer db.Close()
	backlog, err := count(db, *table)
	if err != nil {
		return err
	}

	if err := ensureTopic(*bootstrap, *leaderTopic, *replication); err != nil {
		return err
	}

	limits := goharvest.Limits{}
	if *markQuery > 0 {
		limits.MarkQueryRecords = goharvest.Int(*markQuery)
	}
	if *maxInFlight > 0 {
		limits.MaxInFlightRecords = goharvest.Int(*maxInFlight)
	}
	if *sendConcurrency > 0 {
		limits.SendConcurrency = goharvest.Int(*sendConcurrency)
	}
	level := scribe.Warn
	if *verbose {
		level = scribe.Info
	}
	config := goharvest.Config{
		BaseKafkaConfig: goharvest.KafkaConfigMap{"bootstrap.servers": *bootstrap},
		LeaderGroupID:   *group,
		LeaderTopic:     *leaderTopic,
		DataSource:      *dsn,
		OutboxTable:     *table,
		Limits:          limits,
		Scribe:          scribe.New(scribe.StandardBinding()),
	}
	config.Scribe.SetEnabled(level)
	h, err := goharvest.New(config)
	if err != nil {
		return fmt.Errorf("goharvest config: %v", err)
	}

	var electedAt atomic.Int64
	h.SetEventHandler(func(e goharvest.Event) {
		if _, ok := e.(goharvest.LeaderAcquired); ok {
			electedAt.CompareAndSwap(0, time.Now().UnixNano())
		}
	})
	started := time.Now()
	if err := h.Start(); err != nil {
		return fmt.Errorf("goharvest start: %w", err)
	}
	defer func() {
		h.Stop()
		_ = h.Await()
	}()

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	deadline := time.After(*timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return errors.New("interrupted before the outbox was empty")
		case <-deadline:
			left, _ := count(db, *table)
			return fmt.Errorf("timed out after %v: %d of %d rows still in %s (leader elected: %v)",
				*timeout, left, backlog, *table, electedAt.Load() != 0)
		case <-tick.C:
		}
		if h.State() == goharvest.Stopped {
			return fmt.Errorf("goharvest stopped by itself: %v", h.Await())
		}
		if electedAt.Load() == 0 {
			continue
		}
		empty, err := isEmpty(db, *table)
		if err != nil {
			return err
		}
		if empty {
			break
		}
	}
	done := time.Now()
	elected := time.Unix(0, electedAt.Load())
	seconds := done.Sub(elected).Seconds()
	res := result{
		Rows:            backlog,
		Seconds:         seconds,
		ElectionSeconds: elected.Sub(started).Seconds(),
		Limits: map[string]int{
			"markQueryRecords":   valueOr(limits.MarkQueryRecords, 100),
			"maxInFlightRecords": valueOr(limits.MaxInFlightRecords, 1000),
			"sendConcurrency":    valueOr(limits.SendConcurrency, 8),
		},
		LimitsAreDefault: *markQuery == 0 && *maxInFlight == 0 && *sendConcurrency == 0,
		Goharvest:        "github.com/obsidiandynamics/goharvest",
		LeaderTopic:      *leaderTopic,
	}
	if seconds > 0 {
		res.RowsPerS = float64(backlog) / seconds
	}
	out, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

// valueOr reports the limit goharvest runs with: ours when set, else goharvest's default (as
// documented in goharvest's Limits.SetDefaults).
func valueOr(p *int, def int) int {
	if p != nil {
		return *p
	}
	return def
}

func count(db *sql.DB, table string) (int64, error) {
	var n int64
	// table was checked against tableName above: a plain identifier, as goharvest itself needs.
	if err := db.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
		return 0, fmt.Errorf("cannot count the rows of %s: %w", table, err)
	}
	return n, nil
}

func isEmpty(db *sql.DB, table string) (bool, error) {
	var empty bool
	if err := db.QueryRow("SELECT NOT EXISTS (SELECT 1 FROM " + table + ")").Scan(&empty); err != nil {
		return false, fmt.Errorf("cannot read %s: %w", table, err)
	}
	return empty, nil
}

// ensureTopic creates NELI's one-partition leader topic unless it exists. goneli expects it to be
// auto-created on first subscribe, which a broker with auto.create.topics.enable=false never does.
func ensureTopic(bootstrap, topic string, replication int) error {
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": bootstrap})
	if err != nil {
		return fmt.Errorf("cannot reach Kafka at %s: %w", bootstrap, err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := admin.CreateTopics(ctx, []kafka.TopicSpecification{
		{Topic: topic, NumPartitions: 1, ReplicationFactor: replication},
	})
	if err != nil {
		return fmt.Errorf("cannot create leader topic %q at %s: %w", topic, bootstrap, err)
	}
	for _, r := range res {
		if code := r.Error.Code(); code != kafka.ErrNoError && code != kafka.ErrTopicAlreadyExists {
			return fmt.Errorf("cannot create leader topic %q: %v; fix: create it with one partition, or pass -leader-topic-replication", topic, r.Error)
		}
	}
	return nil
}
