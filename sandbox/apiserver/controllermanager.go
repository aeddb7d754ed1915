package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/pflag"
	kcmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmconfig "k8s.io/kubernetes/cmd/kube-controller-manager/app/config"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	"k8s.io/kubernetes/cmd/kube-controller-manager/names"
)

// kcmControllers are the only controllers run. Deployments and ReplicaSets
// are deliberately absent: the project's pod runner plays those, and a real
// deployment controller would fight it over ReplicaSets and status.
var kcmControllers = []string{
	names.GarbageCollectorController,
	names.NamespaceController,
	names.ServiceAccountController,
	names.ServiceAccountTokenController,
}

// controllerManagerArgs are the kube-controller-manager flags for this sandbox.
func controllerManagerArgs(p *pki, extra []string) []string {
	args := []string{
		"--kubeconfig=" + p.path(kcmKubeconfigFile),
		"--controllers=" + strings.Join(kcmControllers, ","),
		// One instance per state dir: a leader lease would only add writes
		// and a delay before the controllers start.
		"--leader-elect=false",
		// No HTTPS endpoint (healthz/metrics): it would need another port
		// and nobody scrapes it.
		"--secure-port=0",
		"--service-account-private-key-file=" + p.path(saKeyFile),
		"--root-ca-file=" + p.path(caCertFile),
		// Controllers share the manager's own client rather than minting a
		// service account per controller; its user is in system:masters.
		"--use-service-account-credentials=false",
	}
	return append(args, extra...)
}

// newControllerManager parses the flags and builds the controller manager's
// configuration, including its API client. It contacts nothing yet.
func newControllerManager(ctx context.Context, p *pki, extra []string) (*kcmconfig.CompletedConfig, error) {
	s, err := kcmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager default options: %w", err)
	}
	known, disabled, aliases := kcmapp.KnownControllers(), kcmapp.ControllersDisabledByDefault(), kcmapp.ControllerAliases()
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	for _, set := range s.Flags(known, disabled, aliases).FlagSets {
		fs.AddFlagSet(set)
	}
	if err := fs.Parse(controllerManagerArgs(p, extra)); err != nil {
		return nil, fmt.Errorf("parse kube-controller-manager flags: %w", err)
	}
	// The feature gate registry is shared with the apiserver in this process;
	// setting it again from the (identical) flags is harmless.
	if err := s.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, fmt.Errorf("apply kube-controller-manager feature gates: %w", err)
	}
	c, err := s.Config(ctx, known, disabled, aliases)
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager config: %w", err)
	}
	return c.Complete(), nil
}

// runControllerManager runs the controllers until ctx is cancelled.
func runControllerManager(ctx context.Context, c *kcmconfig.CompletedConfig) error {
	if err := kcmapp.Run(ctx, c); err != nil {
		return fmt.Errorf("kube-controller-manager: %w", err)
	}
	return nil
}
