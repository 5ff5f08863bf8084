package global_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/globaltest"
)

// The model of the linearizability check: a register per key. The policy key
// holds (version, document): a write must return the next version; the
// region keys hold a state name.
type linInput struct {
	Key   string // "policy" or a region name
	Write bool
	Value string
}

type linOutput struct {
	Unknown bool // a write whose outcome the client does not know
	Version uint64
	Value   string
}

type linState struct {
	Version uint64
	Value   string
}

var linModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(linInput).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return linState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(linState), input.(linInput), output.(linOutput)
		if in.Key == "policy" {
			if in.Write {
				next := linState{Version: s.Version + 1, Value: in.Value}
				return out.Unknown || out.Version == next.Version, next
			}
			return out.Version == s.Version && out.Value == s.Value, s
		}
		cur := s.Value
		if cur == "" {
			cur = "active"
		}
		if in.Write {
			return true, linState{Value: in.Value}
		}
		return out.Value == cur, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		if in.Write {
			if out.Unknown {
				return fmt.Sprintf("put(%s, %s) -> ?", in.Key, in.Value)
			}
			return fmt.Sprintf("put(%s, %s) -> v%d", in.Key, in.Value, out.Version)
		}
		return fmt.Sprintf("get(%s) -> v%d %s", in.Key, out.Version, out.Value)
	},
}

// TestLinearizable checks with porcupine that policy applies and region state
// changes, written and read (consistent reads) through random nodes by
// concurrent clients while leadership moves and the leader is partitioned
// once, form a linearizable history.
func TestLinearizable(t *testing.T) {
	c := globaltest.NewCluster(t, 3, globaltest.Options{Voters: 3})
	const clients, opsPerClient, maxOpsPerClient = 4, 40, 150
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }

	var (
		mu  sync.Mutex
		ops []porcupine.Operation
	)
	record := func(op porcupine.Operation) {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The nemesis moves leadership (and once partitions the leader) until
	// the leader has changed wantChanges times; the clients keep going until
	// then. A change counts when the agreed leader after the action is
	// another node than before it.
	const wantChanges = 5
	nemesisDone := make(chan struct{})
	changes := 0
	go func() {
		defer close(nemesisDone)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for round := 0; changes < wantChanges && ctx.Err() == nil; round++ {
			<-tick.C
			l, err := c.WaitLeader(5 * time.Second)
			if err != nil {
				continue
			}
			if round == 3 {
				// Partition the leader for a while, then heal.
				others := []int{}
				for i := range c.Nodes {
					if i != l {
						others = append(others, i)
					}
				}
				c.Net.Partition(c.Names(l), c.Names(others...))
				<-time.After(600 * time.Millisecond)
				c.Net.Heal()
			} else if err := c.Nodes[l].Node.TransferLeadership(""); err != nil {
				continue
			}
			if nl, err := c.WaitLeader(5 * time.Second); err == nil && nl != l {
				changes++
			}
		}
	}()

	var wg sync.WaitGroup
	for id := 0; id < clients; id++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(id), 7))
			for i := 0; i < maxOpsPerClient && ctx.Err() == nil; i++ {
				if i >= opsPerClient {
					select {
					case <-nemesisDone:
						return
					default:
					}
				}
				nd := c.Nodes[rng.IntN(len(c.Nodes))]
				cl := global.NewClient(nd.URL(), c.Token, nil)
				region := fmt.Sprintf("region-%d", rng.IntN(2))
				var in linInput
				switch rng.IntN(4) {
				case 0:
					in = linInput{Key: "policy", Write: true, Value: fmt.Sprintf("c%d-%d", id, i)}
				case 1:
					in = linInput{Key: "policy"}
				case 2:
					in = linInput{Key: region, Write: true, Value: []string{"active", "draining", "failed"}[rng.IntN(3)]}
				default:
					in = linInput{Key: region}
				}
				call := now()
				out, err := linDo(ctx, cl, in)
				ret := now()
				if err != nil {
					if !in.Write {
						continue // a failed read observed nothing
					}
					out, ret = linOutput{Unknown: true}, 1<<62
				}
				record(porcupine.Operation{ClientId: id, Input: in, Call: call, Output: out, Return: ret})
			}
		}()
	}
	wg.Wait()
	<-nemesisDone
	if changes < wantChanges {
		t.Fatalf("only %d leader changes were observed", changes)
	}

	res, info := porcupine.CheckOperationsVerbose(linModel, ops, 30*time.Second)
	unknown := 0
	for _, op := range ops {
		if op.Output.(linOutput).Unknown {
			unknown++
		}
	}
	t.Logf("%d operations (%d with unknown outcome), %d leader changes: %v", len(ops), unknown, changes, res)
	if res != porcupine.Ok {
		path := filepath.Join(t.TempDir(), "history.html")
		if err := porcupine.VisualizePath(linModel, info, path); err == nil {
			if b, err := os.ReadFile(path); err == nil {
				out := filepath.Join(os.TempDir(), "meridian-global-linearizability.html")
				_ = os.WriteFile(out, b, 0o644)
				t.Logf("visualization: %s", out)
			}
		}
		t.Fatalf("history is not linearizable: %v", res)
	}
}

func linDo(ctx context.Context, cl *global.Client, in linInput) (linOutput, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	consistent := global.ReadOptions{Consistent: true}
	switch {
	case in.Key == "policy" && in.Write:
		pv, err := cl.ApplyPolicy(ctx, global.PolicyRequest{Name: "lin.yaml", Document: in.Value})
		return linOutput{Version: pv.Version}, err
	case in.Key == "policy":
		pv, err := cl.Policy(ctx, consistent)
		if errors.Is(err, global.ErrNotFound) {
			return linOutput{}, nil
		}
		return linOutput{Version: pv.Version, Value: string(pv.Document)}, err
	case in.Write:
		st, _ := global.ParseRegionState(in.Value)
		_, err := cl.SetRegionState(ctx, in.Key, global.RegionRequest{State: st})
		return linOutput{}, err
	default:
		r, err := cl.Region(ctx, in.Key, consistent)
		return linOutput{Value: r.Region.State.String()}, err
	}
}

// TestLinearizabilityModel makes sure the checker rejects what it must: a
// read that misses an acknowledged write, and a write answered with a
// skipped version.
func TestLinearizabilityModel(t *testing.T) {
	op := func(c int, in linInput, call int64, out linOutput, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret}
	}
	ok := []porcupine.Operation{
		op(0, linInput{Key: "policy", Write: true, Value: "a"}, 0, linOutput{Version: 1}, 10),
		op(1, linInput{Key: "policy"}, 5, linOutput{}, 8), // concurrent: may read before
		op(1, linInput{Key: "policy"}, 11, linOutput{Version: 1, Value: "a"}, 12),
		op(2, linInput{Key: "region-0", Write: true, Value: "failed"}, 0, linOutput{Unknown: true}, 1<<62),
		op(3, linInput{Key: "region-0"}, 20, linOutput{Value: "failed"}, 21),
	}
	if !porcupine.CheckOperations(linModel, ok) {
		t.Fatal("a linearizable history was rejected")
	}
	staleRead := []porcupine.Operation{
		op(0, linInput{Key: "policy", Write: true, Value: "a"}, 0, linOutput{Version: 1}, 10),
		op(1, linInput{Key: "policy"}, 11, linOutput{}, 12),
	}
	if porcupine.CheckOperations(linModel, staleRead) {
		t.Fatal("a stale read after an acknowledged write was accepted")
	}
	skipped := []porcupine.Operation{
		op(0, linInput{Key: "policy", Write: true, Value: "a"}, 0, linOutput{Version: 2}, 10),
	}
	if porcupine.CheckOperations(linModel, skipped) {
		t.Fatal("a skipped version was accepted")
	}
	lostRegion := []porcupine.Operation{
		op(0, linInput{Key: "region-1", Write: true, Value: "draining"}, 0, linOutput{}, 10),
		op(1, linInput{Key: "region-1"}, 20, linOutput{Value: "active"}, 21),
	}
	if porcupine.CheckOperations(linModel, lostRegion) {
		t.Fatal("a lost region write was accepted")
	}
}
