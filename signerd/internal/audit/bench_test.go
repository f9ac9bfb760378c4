package audit

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
)

// The two benchmarks append to a real file with a real fsync. Serial waits
// for every line's fsync in turn; parallel lets lines queue behind a running
// fsync, which is what group commit buys. lines/fsync is the mean batch.

func BenchmarkAppendSerial(b *testing.B) {
	l, batches := benchLog(b)
	ctx := context.Background()
	r := sample(0)
	for b.Loop() {
		if err := l.Append(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/float64(max(batches.Load(), 1)), "lines/fsync")
}

func BenchmarkAppendParallel(b *testing.B) {
	l, batches := benchLog(b)
	b.SetParallelism(32) // many in-flight RPCs per core, as behind a gRPC server
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		r := sample(0)
		for pb.Next() {
			if err := l.Append(ctx, r); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/float64(max(batches.Load(), 1)), "lines/fsync")
}

func benchLog(b *testing.B) (*Log, *atomic.Int64) {
	b.Helper()
	var batches atomic.Int64
	dir := b.TempDir() + "/audit"
	l, err := open(Config{Path: dir + "/bench.log", Replica: "bench", OnBatch: func(int) { batches.Add(1) }}, (*os.File).Sync)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	return l, &batches
}

// BenchmarkSanitize is the per-line cost of making a typical record's free
// text safe (UTF-8, credential search, length).
func BenchmarkSanitize(b *testing.B) {
	r := sample(0)
	r.RequestID = "req-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
	for b.Loop() {
		c := r
		sanitize(&c)
	}
}
