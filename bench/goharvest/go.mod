// goharvest side by side with harvest's relay (bench/bench_goharvest.py builds and runs this).
//
// goharvest v0.3.1 pins confluent-kafka-go v1.5.2, whose librdkafka cannot query offsets on a
// Kafka 4 broker, so this module requires v1.8.2 instead. Since v1.6 that module no longer has the
// kafka/librdkafka package goharvest blank-imports (it became kafka/librdkafka_vendor), so the build
// replaces gopkg.in/confluentinc/confluent-kafka-go.v1 with an unmodified copy of v1.8.2 from the
// module cache plus that one empty package: bench/bench_goharvest.py writes the replace into a
// generated go.mod under .work/ and builds with -modfile, so this file holds no machine path.
module harvest/bench/goharvest

go 1.22

require (
	github.com/lib/pq v1.5.1
	github.com/obsidiandynamics/goharvest v0.3.1
	github.com/obsidiandynamics/libstdgo v0.4.1
	gopkg.in/confluentinc/confluent-kafka-go.v1 v1.8.2
)

require (
	github.com/confluentinc/confluent-kafka-go v1.8.2 // indirect
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/go-ozzo/ozzo-validation v3.6.0+incompatible // indirect
	github.com/google/uuid v1.1.1 // indirect
	github.com/obsidiandynamics/goneli v0.4.3 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/stretchr/testify v1.5.1 // indirect
	gopkg.in/yaml.v2 v2.2.8 // indirect
)
