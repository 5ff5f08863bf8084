package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/meridian-llm/meridian/regional"
)

// routeCommand is `meridian route`: explain the decision for one prompt.
func routeCommand() *cli.Command {
	return &cli.Command{
		Name:      "route",
		Usage:     "explain where a controller would send a prompt (POST /v1/route), without serving it",
		ArgsUsage: "[PROMPT]",
		Description: "Sends the prompt (the argument, --file, or standard input with -) as a chat message to\n" +
			"the controller's decision API and prints the decision: region (and, across regions, the\n" +
			"cost of each candidate region), pod, matched blocks and tokens, and the top candidates\n" +
			"with each term of their expected time to first token. A decision that crosses regions is\n" +
			"recorded in the audit log, as it would be for a served request.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "controller", Value: "http://127.0.0.1:8080", EnvVars: []string{"MERIDIAN_CONTROLLER"}, Usage: "controller base URL"},
			&cli.StringFlag{Name: "api-key", EnvVars: []string{"MERIDIAN_API_KEY"}, Usage: "API key to authenticate with (the controller's auth.mode api_keys): it says the tenant and data classes"},
			&cli.StringFlag{Name: "model", Value: "meridian/sim-70b", Usage: "model name"},
			&cli.StringFlag{Name: "file", Usage: "read the prompt from this file (- for standard input)"},
			&cli.StringFlag{Name: "system", Usage: "a system message before the prompt"},
			&cli.StringFlag{Name: "tenant", Usage: "X-Tenant-Id"},
			&cli.StringFlag{Name: "data-class", Usage: "X-Data-Class (phi, pii, public, ...)"},
			&cli.StringFlag{Name: "session", Usage: "X-Session-Id"},
			&cli.BoolFlag{Name: "json", Usage: "print the decision as JSON"},
		}, tlsClientFlags()...),
		Action: func(c *cli.Context) error {
			prompt := strings.Join(c.Args().Slice(), " ")
			if f := c.String("file"); f != "" {
				b, err := readInput(c, f)
				if err != nil {
					return usageError("route: --file: %w", err)
				}
				prompt = string(b)
			}
			if prompt == "" {
				return usageError("route: a prompt is required (argument or --file)")
			}
			var msgs []map[string]string
			if s := c.String("system"); s != "" {
				msgs = append(msgs, map[string]string{"role": "system", "content": s})
			}
			msgs = append(msgs, map[string]string{"role": "user", "content": prompt})
			body, _ := json.Marshal(map[string]any{"model": c.String("model"), "messages": msgs})
			req, err := http.NewRequestWithContext(c.Context, http.MethodPost, strings.TrimRight(c.String("controller"), "/")+"/v1/route", bytes.NewReader(body))
			if err != nil {
				return usageError("route: --controller: %w", err)
			}
			req.Header.Set("Content-Type", "application/json")
			for flag, h := range map[string]string{"tenant": regional.HeaderTenant, "data-class": regional.HeaderDataClass, "session": regional.HeaderSession} {
				if v := c.String(flag); v != "" {
					req.Header.Set(h, v)
				}
			}
			if k := c.String("api-key"); k != "" {
				req.Header.Set("Authorization", "Bearer "+k)
			}
			hc, err := tlsHTTPClient(c)
			if err != nil {
				return err
			}
			hc.Timeout = 30 * time.Second
			resp, err := hc.Do(req)
			if err != nil {
				return fmt.Errorf("route: %w", err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("route: %s: %s", resp.Status, strings.TrimSpace(string(raw)))
			}
			if c.Bool("json") {
				_, err := c.App.Writer.Write(raw)
				return err
			}
			var rr regional.RouteResponse
			if err := json.Unmarshal(raw, &rr); err != nil {
				return fmt.Errorf("route: answer: %w", err)
			}
			return printRoute(c.App.Writer, &rr)
		},
	}
}

func printRoute(w io.Writer, rr *regional.RouteResponse) error {
	fmt.Fprintf(w, "decision %s: %d prompt tokens, %d blocks of %d\n", rr.DecisionID, rr.PromptTokens, rr.Blocks, rr.BlockSize)
	if rr.Remote {
		fmt.Fprintf(w, "region: %s (another region; forward to %s)\n", rr.Region, rr.ForwardTo)
	} else {
		fmt.Fprintf(w, "region: %s (here)\n", rr.Region)
	}
	if rr.Cost != nil {
		var ex regional.CostExplanation
		if json.Unmarshal(rr.Cost, &ex) == nil && len(ex.Candidates) > 0 {
			fmt.Fprintf(w, "regions compared (%s; a remote region must save more than %.0f ms):\n", ex.Reason, ex.RequiredMs)
			tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "  region\tcached\tqueue ms\tprefill ms\toverhead ms\trtt ms\ttotal ms\tnote")
			for _, c := range ex.Candidates {
				fmt.Fprintf(tw, "  %s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%s\n", c.Region, c.CachedTokens, c.Estimate.QueueMs,
					c.Estimate.PrefillMs, c.Estimate.OverheadMs, c.Estimate.RTTMs, c.Estimate.TotalMs, c.Estimate.Excluded)
			}
			tw.Flush()
		}
	}
	if d := rr.Decision; d != nil {
		fmt.Fprintf(w, "pod: %s %s (%s, %s): %d blocks matched, %d tokens cached (predicted), %d to prefill\n",
			d.PodName, d.Endpoint, d.Policy, d.Reason, d.MatchedBlocks, d.CachedTokens, d.Uncached)
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  pod\tmatched\tcached\tin flight\tqueue ms\tprefill ms\textra ms\ttotal ms")
		for _, t := range d.Top {
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\n", t.Pod, t.MatchedBlocks, t.CachedTokens, t.Load.InFlight,
				t.Estimate.QueueMs, t.Estimate.PrefillMs, t.Estimate.ExtraMs, t.Estimate.TotalMs)
		}
		tw.Flush()
	}
	return nil
}
