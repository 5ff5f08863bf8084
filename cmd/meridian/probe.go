package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/urfave/cli/v2"
)

// probeCommand is a health check for images without a shell or an
// https-capable wget (the runtime image has neither): GET a URL, verify its
// certificate against --ca-cert, exit 0 on a 2xx answer and 1 otherwise.
func probeCommand() *cli.Command {
	return &cli.Command{
		Name:      "probe",
		Usage:     "GET a URL (such as https://127.0.0.1:8080/readyz) and exit 0 on a 2xx answer",
		ArgsUsage: "URL",
		Flags: append([]cli.Flag{
			&cli.DurationFlag{Name: "timeout", Value: 2 * time.Second, Usage: "give up after this long"},
		}, tlsClientFlags()...),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageError("%s: one URL is required", cmdPath(c))
			}
			u, err := url.Parse(c.Args().First())
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usageError("%s: %q is not an http or https URL", cmdPath(c), c.Args().First())
			}
			hc, err := tlsHTTPClient(c)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(c.Context, c.Duration("timeout"))
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
			if err != nil {
				return err
			}
			resp, err := hc.Do(req)
			if err != nil {
				return fmt.Errorf("probe %s: %w", u, err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			if resp.StatusCode/100 != 2 {
				return fmt.Errorf("probe %s: %s: %s", u, resp.Status, bytes.TrimSpace(body))
			}
			return nil
		},
	}
}
