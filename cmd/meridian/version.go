package main

import (
	"fmt"
	"runtime"

	"github.com/urfave/cli/v2"
)

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version, commit and Go version of this binary",
		Action: func(c *cli.Context) error {
			_, err := fmt.Fprintf(c.App.Writer, "meridian %s (commit %s, %s %s/%s)\n",
				version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return err
		},
	}
}
