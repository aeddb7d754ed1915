// Command twc-kstatus prints the kstatus of Kubernetes objects read from
// stdin: the health verdict that Flux, Helm 4 (--wait) and kpt compute with
// sigs.k8s.io/cli-utils/pkg/kstatus/status. The tests use it to show that a
// TemporalWorkerDeployment reads as InProgress while it rolls out and as
// Current once it is Ready.
//
// Input: one object, a List (kubectl get -o json), or a stream of objects,
// as JSON or YAML (multi-document). Output: one JSON line per object,
//
//	{"kind":"TemporalWorkerDeployment","namespace":"demo","name":"hello","status":"Current","message":"Resource is Ready"}
//
// Exit status: 0 when every object was computed; 1 on unreadable input; 3
// when --want is given and some object's status differs from it.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

const exitMismatch = 3

// verdict is one output line.
type verdict struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	Message   string `json:"message"`
}

func main() {
	want := flag.String("want", "", "exit with status 3 unless every object has this status (Current, InProgress, Failed, Terminating, NotFound, Unknown)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: kubectl get ... -o json | %s [--want STATUS]\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	objects, err := readObjects(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "twc-kstatus: %v\n", err)
		os.Exit(1)
	}
	out := json.NewEncoder(os.Stdout)
	mismatch := false
	for _, object := range objects {
		result, err := status.Compute(object)
		if err != nil {
			fmt.Fprintf(os.Stderr, "twc-kstatus: %s %s/%s: %v\n", object.GetKind(), object.GetNamespace(), object.GetName(), err)
			os.Exit(1)
		}
		v := verdict{
			Kind:      object.GetKind(),
			Namespace: object.GetNamespace(),
			Name:      object.GetName(),
			Status:    result.Status.String(),
			Message:   result.Message,
		}
		if err := out.Encode(v); err != nil {
			fmt.Fprintf(os.Stderr, "twc-kstatus: writing output: %v\n", err)
			os.Exit(1)
		}
		if *want != "" && v.Status != *want {
			mismatch = true
		}
	}
	if mismatch {
		os.Exit(exitMismatch)
	}
}

// readObjects decodes every document of the input, expanding Lists.
func readObjects(r io.Reader) ([]*unstructured.Unstructured, error) {
	decoder := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(r), 4096)
	var objects []*unstructured.Unstructured
	for {
		var doc json.RawMessage
		if err := decoder.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("decoding input: %w", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		// This Unmarshal keeps integers int64, as the kstatus accessors expect.
		var raw map[string]interface{}
		if err := utiljson.Unmarshal(doc, &raw); err != nil {
			return nil, fmt.Errorf("decoding input: %w", err)
		}
		if raw == nil {
			continue
		}
		object := &unstructured.Unstructured{Object: raw}
		if object.IsList() {
			list, err := object.ToList()
			if err != nil {
				return nil, fmt.Errorf("reading a %s: %w", object.GetKind(), err)
			}
			for i := range list.Items {
				objects = append(objects, &list.Items[i])
			}
			continue
		}
		objects = append(objects, object)
	}
	if len(objects) == 0 {
		return nil, errors.New("no object on stdin")
	}
	return objects, nil
}
