// Copyright (c) k3s_gpu.nvidia contributors
// GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
// SPDX-License-Identifier: GPL-3.0-or-later

// render is the test oracle for the Python template model: Go's own text/template renders a
// user's containerd template the way k3s does. Standard library only; built by
// tests/oracle/goracle.py (GO111MODULE=off, GOPROXY=off, CGO_ENABLED=0), never needed on nodes.
//
// Batch mode (one process for the whole batch):
//
//	stdin:  [{"name": str, "main": str, "base": str|null, "data": any, "funcs": [str]|null}, ...]
//	stdout: [{"name": str, "ok": bool, "phase": "parse"|"exec"|null, "error": str|null,
//	          "output": str|null}, ...]
//
// What it does per case, mirroring k3s pkg/agent/templates/templates.go ParseTemplateFromConfig
// (k3s-io/k3s @053afed3):
//
//	t := template.Must(template.New("compiled_template").Funcs(templateFuncs).Parse(templateBuffer))
//	template.Must(t.New("base").Parse(ContainerdConfigTemplate))
//	t.Execute(out, config)
//
// so: the functions are registered BEFORE the user's text is parsed (an unknown function is a
// parse error), the user's text is the main template "compiled_template" (the name Go puts in
// every error message), "base" is parsed afterwards into the same set (a user {{define "base"}}
// is replaced by it), and the main template is executed. k3s panics on a parse error
// (template.Must); here it is reported as phase "parse" (main or base text), an Execute error as
// phase "exec" (k3s then returns the error and writes nothing, so output is null).
//
// Differences from the node, on purpose:
//   - The data is JSON (maps, lists, scalars), not k3s's ContainerdConfig struct. The option
//     missingkey=error makes a missing map key fail at exec like a missing struct field does on
//     the node; the message differs: `map has no entry for key "Gone"` here,
//     `can't evaluate field Gone in type *config.Node` on the node.
//   - JSON numbers with an integral value become int64 (k3s's numeric fields are ints, and
//     `eq .X 1` must compare int with int); other numbers stay float64. null is a nil interface.
//   - "base": null (or absent) registers no "base" template at all.
//   - "funcs": a list of names restricts the FuncMap to those names (older releases had fewer
//     functions, see below); null or absent means all of them.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"
)

// templateFuncs: k3s's Linux FuncMap (pkg/agent/templates/templates_linux.go). Sources:
//   - deschemify: identity on Linux (the Windows build strips an npipe: scheme). Seen in
//     k3s-io/k3s forks of the v1.27+ tree (atopion/k3s @143e9309, mnasiadka/k3s @f25c1b28,
//     Bao0ne/k3s @9b8a7b39: `"deschemify": func(s string) string { return s }`).
//   - toJson: `func(v any) string { output, _ := json.Marshal(v); return string(output) }`
//     (marshal errors are dropped, so it renders "" for an unmarshalable value).
//   - filepathjoin: filepath.Join.
//     toJson and filepathjoin: the newest stored templates_linux.go text in the code index
//     (index id 8479697069, a k3s templates_linux.go; the index does not name which repository
//     or commit) and the project's reference docs/k3s-facts.md §5. The k3s-io/k3s tree itself
//     is over the mirror limit, so the exact release that added each one was not verified.
var templateFuncs = template.FuncMap{
	"deschemify": func(s string) string {
		return s
	},
	"toJson": func(v any) string {
		output, _ := json.Marshal(v)
		return string(output)
	},
	"filepathjoin": filepath.Join,
}

// mainName is the name k3s gives the user's template; Go prints it in every error.
const mainName = "compiled_template"

type renderCase struct {
	Name  string          `json:"name"`
	Main  string          `json:"main"`
	Base  *string         `json:"base"`
	Data  json.RawMessage `json:"data"`
	Funcs *[]string       `json:"funcs"`
}

type result struct {
	Name   string  `json:"name"`
	OK     bool    `json:"ok"`
	Phase  *string `json:"phase"`
	Error  *string `json:"error"`
	Output *string `json:"output"`
}

func str(s string) *string { return &s }

func failure(name, phase string, err error) result {
	return result{Name: name, OK: false, Phase: str(phase), Error: str(err.Error())}
}

// decodeData turns the case's JSON data into nested map[string]any / []any / scalars, with
// integral numbers as int64.
func decodeData(raw json.RawMessage) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return typedRuntimes(convertNumbers(v)), nil
}

// runtimeConfig mirrors k3s's templates.ContainerdRuntimeConfig: on the node .ExtraRuntimes is a
// map[string]ContainerdRuntimeConfig, so `index .ExtraRuntimes "x"` of a missing name is a zero
// struct (not nil) and a missing field of an entry is `can't evaluate field`.
type runtimeConfig struct {
	RuntimeType string
	BinaryName  string
}

func typedRuntimes(v any) any {
	top, ok := v.(map[string]any)
	if !ok {
		return v
	}
	raw, ok := top["ExtraRuntimes"].(map[string]any)
	if !ok {
		return v
	}
	typed := make(map[string]runtimeConfig, len(raw))
	for name, entry := range raw {
		fields, _ := entry.(map[string]any)
		rt, _ := fields["RuntimeType"].(string)
		bin, _ := fields["BinaryName"].(string)
		typed[name] = runtimeConfig{RuntimeType: rt, BinaryName: bin}
	}
	top["ExtraRuntimes"] = typed
	return top
}

func convertNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = convertNumbers(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = convertNumbers(e)
		}
		return x
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		if f, err := x.Float64(); err == nil {
			return f
		}
		return x.String()
	default:
		return v
	}
}

func funcsFor(names *[]string) (template.FuncMap, error) {
	if names == nil {
		return templateFuncs, nil
	}
	funcs := template.FuncMap{}
	for _, n := range *names {
		f, ok := templateFuncs[n]
		if !ok {
			known := make([]string, 0, len(templateFuncs))
			for k := range templateFuncs {
				known = append(known, k)
			}
			sort.Strings(known)
			return nil, fmt.Errorf("unknown function %q in \"funcs\" (known: %s)", n, strings.Join(known, ", "))
		}
		funcs[n] = f
	}
	return funcs, nil
}

func renderOne(c renderCase) (res result) {
	defer func() {
		// text/template recovers panics inside called functions itself; this is a last resort
		// so that one case can never take the batch down.
		if r := recover(); r != nil {
			res = failure(c.Name, "exec", fmt.Errorf("panic: %v", r))
		}
	}()
	funcs, err := funcsFor(c.Funcs)
	if err != nil {
		return failure(c.Name, "input", err)
	}
	data, err := decodeData(c.Data)
	if err != nil {
		return failure(c.Name, "input", fmt.Errorf("data: %w", err))
	}
	t, err := template.New(mainName).Funcs(funcs).Option("missingkey=error").Parse(c.Main)
	if err != nil {
		return failure(c.Name, "parse", err)
	}
	if c.Base != nil {
		if _, err := t.New("base").Parse(*c.Base); err != nil {
			return failure(c.Name, "parse", err)
		}
	}
	var out bytes.Buffer
	if err := t.Execute(&out, data); err != nil {
		return failure(c.Name, "exec", err)
	}
	return result{Name: c.Name, OK: true, Output: str(out.String())}
}

func run(in io.Reader, out io.Writer) error {
	var cases []renderCase
	dec := json.NewDecoder(bufio.NewReader(in))
	if err := dec.Decode(&cases); err != nil {
		return fmt.Errorf("stdin: want a JSON array of cases: %w", err)
	}
	results := make([]result, 0, len(cases))
	for _, c := range cases {
		results = append(results, renderOne(c))
	}
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(results); err != nil {
		return err
	}
	return w.Flush()
}

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "usage: render < cases.json > results.json (no arguments; see the comment at the top of render.go)")
		os.Exit(2)
	}
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}
