package global

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// A voters script (testdata/voters/*.txt, same block format as the
// failover scripts; -update rewrites the output). Commands:
//
//	config voters=N per-region=K   Config.Voters and VotersPerRegion
//	server ID REGION [voter] [leader] [down] [behind]
//	                               add (or replace) a server (REGION "-":
//	                               no member record yet): a voter, the
//	                               leader, not answering, not caught up
//	set ID up|down|caught-up|behind|leader
//	remove ID                      the server leaves the configuration
//	plan                           print the next round's changes
//	apply                          plan, apply the round, print it
//	settle                         apply rounds until nothing changes
//	voters                         print the voters by region
type votersScript struct {
	t         *testing.T
	voters    int
	perRegion int
	servers   []voterCandidate
}

func (s *votersScript) find(id string) int {
	i := slices.IndexFunc(s.servers, func(c voterCandidate) bool { return c.ID == id })
	if i < 0 {
		s.t.Fatalf("no server %s", id)
	}
	return i
}

func planLine(p voterPlan) string {
	if len(p.Promote) == 0 && len(p.Demote) == 0 {
		return fmt.Sprintf("want %d: no change", p.Want)
	}
	var parts []string
	if len(p.Promote) > 0 {
		parts = append(parts, "promote "+strings.Join(p.Promote, ","))
	}
	if len(p.Demote) > 0 {
		parts = append(parts, "demote "+strings.Join(p.Demote, ","))
	}
	return fmt.Sprintf("want %d: %s", p.Want, strings.Join(parts, "; "))
}

func (s *votersScript) apply(p voterPlan) {
	for _, id := range p.Promote {
		s.servers[s.find(id)].Voter = true
	}
	for _, id := range p.Demote {
		s.servers[s.find(id)].Voter = false
	}
}

func (s *votersScript) run(cmd string) []string {
	f := strings.Fields(cmd)
	switch f[0] {
	case "config":
		for _, a := range f[1:] {
			k, v, _ := strings.Cut(a, "=")
			n, err := strconv.Atoi(v)
			if err != nil {
				s.t.Fatalf("%q: %v", cmd, err)
			}
			switch k {
			case "voters":
				s.voters = n
			case "per-region":
				s.perRegion = n
			default:
				s.t.Fatalf("%q: unknown key %s", cmd, k)
			}
		}
	case "server":
		c := voterCandidate{ID: f[1], Region: strings.TrimPrefix(f[2], "-"), Up: true, CaughtUp: true}
		for _, flag := range f[3:] {
			switch flag {
			case "voter":
				c.Voter = true
			case "leader":
				c.Leader, c.Voter = true, true
			case "down":
				c.Up, c.CaughtUp = false, false
			case "behind":
				c.CaughtUp = false
			default:
				s.t.Fatalf("%q: unknown flag %s", cmd, flag)
			}
		}
		s.servers = slices.DeleteFunc(s.servers, func(o voterCandidate) bool { return o.ID == c.ID })
		s.servers = append(s.servers, c)
	case "set":
		c := &s.servers[s.find(f[1])]
		switch f[2] {
		case "up":
			c.Up, c.CaughtUp = true, true
		case "down":
			c.Up, c.CaughtUp = false, false
		case "caught-up":
			c.CaughtUp = true
		case "behind":
			c.CaughtUp = false
		case "leader":
			for i := range s.servers {
				s.servers[i].Leader = false
			}
			c.Leader, c.Voter, c.Up = true, true, true
		default:
			s.t.Fatalf("%q: unknown state", cmd)
		}
	case "remove":
		s.servers = slices.DeleteFunc(s.servers, func(o voterCandidate) bool { return o.ID == f[1] })
	case "plan":
		return []string{planLine(planVoters(s.servers, s.voters, s.perRegion))}
	case "apply":
		p := planVoters(s.servers, s.voters, s.perRegion)
		s.apply(p)
		return []string{planLine(p)}
	case "settle":
		var out []string
		for round := 1; round <= 10; round++ {
			p := planVoters(s.servers, s.voters, s.perRegion)
			if len(p.Promote) == 0 && len(p.Demote) == 0 {
				return append(out, fmt.Sprintf("settled after %d rounds", round-1))
			}
			s.apply(p)
			out = append(out, fmt.Sprintf("round %d: %s", round, planLine(p)))
		}
		return append(out, "not settled after 10 rounds")
	case "voters":
		by := map[string][]string{}
		for _, c := range s.servers {
			if c.Voter {
				by[c.Region] = append(by[c.Region], c.ID)
			}
		}
		var out []string
		for _, r := range slices.Sorted(func(yield func(string) bool) {
			for r := range by {
				if !yield(r) {
					return
				}
			}
		}) {
			slices.Sort(by[r])
			out = append(out, cmp.Or(r, "-")+": "+strings.Join(by[r], ","))
		}
		if len(out) == 0 {
			return []string{"no voters"}
		}
		return out
	default:
		s.t.Fatalf("unknown command %q", cmd)
	}
	return nil
}

func TestVoterScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/voters/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			s := &votersScript{t: t, voters: 3, perRegion: 1}
			blocks := parseScript(t, path)
			var rewritten strings.Builder
			for i, b := range blocks {
				var got []string
				for _, cmd := range b.cmds {
					got = append(got, s.run(cmd)...)
				}
				if len(got) == 0 {
					got = []string{"ok"}
				}
				for _, c := range b.comments {
					rewritten.WriteString(c + "\n")
				}
				for _, c := range b.cmds {
					rewritten.WriteString(c + "\n")
				}
				rewritten.WriteString("----\n" + strings.Join(got, "\n") + "\n")
				if i < len(blocks)-1 {
					rewritten.WriteString("\n")
				}
				if !*update && strings.Join(got, "\n") != strings.Join(b.want, "\n") {
					t.Errorf("%s: block %d (%s):\ngot:\n%s\nwant:\n%s", path, i+1, strings.Join(b.cmds, "; "),
						strings.Join(got, "\n"), strings.Join(b.want, "\n"))
				}
			}
			if *update {
				if err := os.WriteFile(path, []byte(rewritten.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// Whatever the servers, their regions, health and current votes, applying
// the plan round after round settles within a few rounds on: an odd number
// of voters (the wanted number), the leader among them, no region over its
// cap, every voter in a known region, a voter that is down only where no
// member that is up could replace it; no round both promotes and demotes,
// and none demotes the leader.
func TestVoterPlacementSettles(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		voters := rapid.SampledFrom([]int{1, 3, 5}).Draw(rt, "voters")
		perRegion := rapid.IntRange(1, 2).Draw(rt, "per_region")
		n := rapid.IntRange(1, 9).Draw(rt, "servers")
		regions := []string{"a", "b", "c", "d", ""}
		var ss []voterCandidate
		for i := range n {
			c := voterCandidate{ID: fmt.Sprintf("s%d", i), Region: rapid.SampledFrom(regions).Draw(rt, "region"),
				Voter: rapid.Bool().Draw(rt, "voter"), Up: rapid.Bool().Draw(rt, "up")}
			c.CaughtUp = c.Up && rapid.Bool().Draw(rt, "caught_up")
			ss = append(ss, c)
		}
		if l := rapid.IntRange(-1, n-1).Draw(rt, "leader"); l >= 0 && ss[l].Region != "" {
			ss[l].Leader, ss[l].Voter, ss[l].Up, ss[l].CaughtUp = true, true, true, true
		}
		var last voterPlan
		for round := 0; ; round++ {
			if round > 6 {
				rt.Fatalf("not settled after 6 rounds: %+v", ss)
			}
			p := planVoters(ss, voters, perRegion)
			if len(p.Promote) > 0 && len(p.Demote) > 0 {
				rt.Fatalf("a round both promotes and demotes: %+v", p)
			}
			for _, id := range p.Demote {
				if ss[slices.IndexFunc(ss, func(c voterCandidate) bool { return c.ID == id })].Leader {
					rt.Fatalf("demotes the leader: %+v", p)
				}
			}
			if len(p.Promote) == 0 && len(p.Demote) == 0 {
				last = p
				break
			}
			for i := range ss {
				if slices.Contains(p.Promote, ss[i].ID) {
					ss[i].Voter = true
				}
				if slices.Contains(p.Demote, ss[i].ID) {
					ss[i].Voter = false
				}
			}
		}
		if last.Want < 1 {
			return
		}
		got, perR, known := 0, map[string]int{}, map[string]bool{}
		for _, c := range ss {
			if c.Region != "" && (c.Leader || c.Voter || (c.Up && c.CaughtUp)) {
				known[c.Region] = true
			}
		}
		cap := perRegionCap(len(known), voters, perRegion)
		for _, c := range ss {
			if !c.Voter {
				continue
			}
			got++
			perR[c.Region]++
			if c.Region == "" {
				rt.Fatalf("a voter in an unknown region: %+v", c)
			}
			if perR[c.Region] > cap {
				rt.Fatalf("region %s holds %d voters, cap %d: %+v", c.Region, perR[c.Region], cap, ss)
			}
		}
		if got != last.Want {
			rt.Fatalf("%d voters, want %d: %+v", got, last.Want, ss)
		}
		// A voter that is down keeps its seat only when no member that is
		// up and caught up could take it within the region caps.
		for _, c := range ss {
			if !c.Voter || c.Up || c.Leader {
				continue
			}
			for _, o := range ss {
				if !o.Voter && o.Up && o.CaughtUp && o.Region != "" && perR[o.Region] < cap && (o.Region == c.Region || perR[c.Region] <= cap) {
					rt.Fatalf("voter %s is down while %s could vote: %+v", c.ID, o.ID, ss)
				}
			}
		}
		if last.Want%2 == 0 {
			rt.Fatalf("even number of voters wanted: %d", last.Want)
		}
		for _, c := range ss {
			if c.Leader && !c.Voter {
				rt.Fatalf("the leader lost its vote")
			}
		}
	})
}
