// Copyright (c) k3s_gpu.nvidia contributors
// GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
// SPDX-License-Identifier: GPL-3.0-or-later

// helm-render: the test suite's offline `helm template` on Helm's own engine (helm.sh/helm/v4).
//
//	helm-render NAME CHART [-n NAMESPACE] [-f VALUES]... [--set K=V]... [--set-string K=V]...
//	            [--kube-version vX.Y.Z] [--api-versions GROUP/VERSION]... [--include-crds]
//	helm-render --version
//
// It loads a chart archive or directory, merges the values as helm does (files in order, then --set,
// then --set-string), runs the install action client-only as a dry run (what `helm template` does:
// synthetic Capabilities, `lookup` returns nothing, no cluster), and prints the manifests and hooks in
// `helm template`'s format. A chart that rejects its values (`fail`, `required`, values.schema.json)
// makes it exit 1 with the chart's own message on stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/cli/values"
	"helm.sh/helm/v4/pkg/getter"
	release "helm.sh/helm/v4/pkg/release/v1"
)

const helmModule = "helm.sh/helm/v4"

type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

type options struct {
	namespace   string
	kubeVersion string
	includeCRDs bool
	version     bool
	apiVersions repeated
	values      values.Options
}

// parse reads flags before, between and after the two positional arguments (helm's own order is free).
func parse(args []string) (*options, []string, error) {
	opts := &options{}
	fs := flag.NewFlagSet("helm-render", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&opts.namespace, "n", "default", "namespace")
	fs.StringVar(&opts.namespace, "namespace", "default", "namespace")
	fs.Var((*repeated)(&opts.values.ValueFiles), "f", "values file")
	fs.Var((*repeated)(&opts.values.ValueFiles), "values", "values file")
	fs.Var((*repeated)(&opts.values.Values), "set", "K=V")
	fs.Var((*repeated)(&opts.values.StringValues), "set-string", "K=V (string)")
	fs.StringVar(&opts.kubeVersion, "kube-version", "", "Kubernetes version for Capabilities")
	fs.Var(&opts.apiVersions, "api-versions", "extra API version for Capabilities")
	fs.BoolVar(&opts.includeCRDs, "include-crds", false, "include the chart's CRDs")
	fs.BoolVar(&opts.version, "version", false, "print the version")
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	return opts, positional, nil
}

func helmVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == helmModule {
				return dep.Version
			}
		}
	}
	return "(unknown)"
}

func render(opts *options, name, chartPath string, out io.Writer) error {
	chrt, err := loader.Load(chartPath)
	if err != nil {
		return fmt.Errorf("loading chart %s: %w", chartPath, err)
	}
	vals, err := opts.values.MergeValues(getter.Providers{})
	if err != nil {
		return err
	}
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = name
	install.Namespace = opts.namespace
	install.Replace = true // no release-name check: nothing is stored
	install.IncludeCRDs = opts.includeCRDs
	install.APIVersions = common.VersionSet(opts.apiVersions)
	if opts.kubeVersion != "" {
		kube, err := common.ParseKubeVersion(opts.kubeVersion)
		if err != nil {
			return fmt.Errorf("invalid --kube-version %q: %w", opts.kubeVersion, err)
		}
		install.KubeVersion = kube
	}
	releaser, err := install.RunWithContext(context.Background(), chrt, vals)
	if err != nil {
		return err
	}
	var rel *release.Release
	switch r := releaser.(type) {
	case *release.Release:
		rel = r
	case release.Release:
		rel = &r
	default:
		return fmt.Errorf("unexpected release type %T", releaser)
	}
	fmt.Fprintln(out, strings.TrimSpace(rel.Manifest))
	for _, hook := range rel.Hooks {
		fmt.Fprintf(out, "---\n# Source: %s\n%s\n", hook.Path, hook.Manifest)
	}
	return nil
}

func main() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	opts, args, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "helm-render: %v\n", err)
		os.Exit(2)
	}
	if opts.version {
		fmt.Printf("helm-render %s %s %s\n", helmModule, helmVersion(), runtime.Version())
		return
	}
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: helm-render NAME CHART [-n NAMESPACE] [-f VALUES]... [--set K=V]... [--set-string K=V]... [--kube-version vX.Y.Z]")
		os.Exit(2)
	}
	if err := render(opts, args[0], args[1], os.Stdout); err != nil {
		var exit = 1
		if errors.Is(err, context.Canceled) {
			exit = 130
		}
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(exit)
	}
}
