package global_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/meridian-llm/meridian/global"
	"github.com/meridian-llm/meridian/global/audit"
	"github.com/meridian-llm/meridian/global/globaltest"
)

func votersByRegion(t *testing.T, c *globaltest.Cluster) map[string][]string {
	t.Helper()
	l, err := c.Leader()
	if err != nil {
		return nil
	}
	servers, err := c.Nodes[l].Node.Servers()
	if err != nil {
		return nil
	}
	out := map[string][]string{}
	for _, s := range servers {
		if s.Suffrage != "voter" {
			continue
		}
		for _, nd := range c.Nodes {
			if nd.Name == s.ID {
				out[nd.Region] = append(out[nd.Region], s.ID)
			}
		}
	}
	return out
}

// Three regions of two controllers each: the leader places one voter per
// region. A voter that stops answering is replaced by the other controller
// of its region (promoted, then the old voter demoted), each change an
// admin_action record (by the leader itself, with its reason) in the
// leader's audit log; when the old voter comes back it stays a non-voter.
func TestVotersSpreadAcrossRegions(t *testing.T) {
	ac := newAuditedClusterWith(t, 6, globaltest.Options{Voters: 3, VotersPerRegion: 1,
		Region:    func(i int) string { return fmt.Sprintf("region-%d", i/2) },
		Configure: func(i int, cfg *global.Config) { cfg.VoterDownAfter = 3 * time.Second }})
	c := ac.Cluster
	recorded := func(action, member string) bool {
		return len(ac.where(t, func(_ audit.Record, d audit.AdminDetail) bool {
			return d.Action == action && d.Args["member"] == member && d.Outcome == audit.OutcomeApplied &&
				d.Auth == audit.AuthInternal && d.Args["reason"] != ""
		})) > 0
	}
	spread := func() bool {
		by := votersByRegion(t, c)
		if len(by) != 3 {
			return false
		}
		for _, ids := range by {
			if len(ids) != 1 {
				return false
			}
		}
		return true
	}
	c.WaitFor(10*time.Second, "one voter in each of the three regions", spread)
	t.Logf("voters: %v", votersByRegion(t, c))

	leader, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	victim, other := -1, -1
	for i, nd := range c.Nodes {
		if i == leader || nd.Region == c.Nodes[leader].Region {
			continue
		}
		if by := votersByRegion(t, c); slices.Contains(by[nd.Region], nd.Name) {
			victim, other = i, i^1
			break
		}
	}
	if victim < 0 {
		t.Fatal("no voter outside the leader's region")
	}
	stopped := time.Now()
	c.Stop(victim)
	c.WaitFor(60*time.Second, "the stopped voter replaced by its region's other controller", func() bool {
		by := votersByRegion(t, c)
		return spread() && slices.Contains(by[c.Nodes[victim].Region], c.Nodes[other].Name) &&
			recorded(global.ActionMemberPromote, c.Nodes[other].Name) && recorded(global.ActionMemberDemote, c.Nodes[victim].Name)
	})
	t.Logf("voter %s replaced by %s in %v", c.Nodes[victim].Name, c.Nodes[other].Name, time.Since(stopped).Round(time.Millisecond))
	if err := c.Start(victim); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(10*time.Second, "the restarted controller to catch up", func() bool { return c.Converged() })
	if by := votersByRegion(t, c); !spread() || slices.Contains(by[c.Nodes[victim].Region], c.Nodes[victim].Name) {
		t.Errorf("after the old voter came back: %v", by)
	}
}
