package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

const (
	// serviceClusterIPRange is only configuration: the apiserver allocates
	// Service ClusterIPs from it, nothing ever routes to them here.
	serviceClusterIPRange = "10.0.0.0/24"
	// serviceIP is the first address of that range, which the apiserver
	// reserves for the "kubernetes" service.
	serviceIP = "10.0.0.1"
	// serviceAccountIssuer is the usual in-cluster issuer name.
	serviceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

	readyTimeout = 3 * time.Minute
)

// apiserverArgs are the kube-apiserver command-line flags for this sandbox.
func apiserverArgs(p *pki, port, etcdClientPort int, extra []string) []string {
	args := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + p.path(servingCertFile),
		"--tls-private-key-file=" + p.path(servingKeyFile),
		"--client-ca-file=" + p.path(caCertFile),
		"--token-auth-file=" + p.path(tokenFile),
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=" + serviceAccountIssuer,
		"--service-account-key-file=" + p.path(saPubFile),
		"--service-account-signing-key-file=" + p.path(saKeyFile),
		"--service-cluster-ip-range=" + serviceClusterIPRange,
		"--etcd-servers=" + etcdClientURL(etcdClientPort),
		"--allow-privileged=true",
		// The "kubernetes" Endpoints object would hold 127.0.0.1, which
		// Endpoints validation rejects; nothing needs it here, so skip it.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	}
	// Extra flags come last so they override the defaults above.
	return append(args, extra...)
}

// apiserver is a configured, not yet running kube-apiserver.
type apiserver struct {
	opts     apiserveroptions.CompletedOptions
	port     int
	listener net.Listener
}

// newAPIServer parses and validates the kube-apiserver flags. The listener
// is opened here and handed over, so the port cannot be taken meanwhile.
func newAPIServer(ctx context.Context, p *pki, wantPort, etcdClientPort int, extra []string) (*apiserver, error) {
	listener, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(wantPort)))
	if err != nil {
		return nil, fmt.Errorf("listen for kube-apiserver: %w", err)
	}
	port := listener.Addr().(*net.TCPAddr).Port
	opts, err := completeAPIServerOptions(ctx, apiserverArgs(p, port, etcdClientPort, extra), listener)
	if err != nil {
		listener.Close()
		return nil, err
	}
	return &apiserver{opts: opts, port: port, listener: listener}, nil
}

func completeAPIServerOptions(ctx context.Context, args []string, listener net.Listener) (apiserveroptions.CompletedOptions, error) {
	s := apiserveroptions.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, set := range s.Flags().FlagSets {
		fs.AddFlagSet(set)
	}
	if err := fs.Parse(args); err != nil {
		return apiserveroptions.CompletedOptions{}, fmt.Errorf("parse kube-apiserver flags: %w", err)
	}
	s.SecureServing.Listener = listener
	// Feature gates and emulated versions are resolved from the flags here, as
	// the kube-apiserver command does before completing its options.
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return apiserveroptions.CompletedOptions{}, fmt.Errorf("apply kube-apiserver feature gates: %w", err)
	}
	completed, err := s.Complete(ctx)
	if err != nil {
		return apiserveroptions.CompletedOptions{}, fmt.Errorf("complete kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return apiserveroptions.CompletedOptions{}, fmt.Errorf("invalid kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}
	return completed, nil
}

// run serves until ctx is cancelled, then shuts down gracefully.
func (a *apiserver) run(ctx context.Context) error {
	if err := apiserverapp.Run(ctx, a.opts); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	return nil
}

func (a *apiserver) url() string {
	return "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(a.port))
}

// waitReady polls /readyz as the admin user until it answers 200, the server
// stops (failed is closed), ctx ends or readyTimeout passes.
func waitReady(ctx context.Context, baseURL string, caPEM []byte, token string, failed <-chan struct{}) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return errors.New("wait for readyz: CA certificate does not parse")
	}
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	defer client.CloseIdleConnections()

	deadline := time.After(readyTimeout)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if last = probeReadyz(ctx, client, baseURL+"/readyz", token); last == nil {
			return nil
		}
		select {
		case <-failed:
			return errors.New("kube-apiserver stopped before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("wait for readyz: %w", ctx.Err())
		case <-deadline:
			return fmt.Errorf("kube-apiserver not ready after %s: %w", readyTimeout, last)
		case <-tick.C:
		}
	}
}

func probeReadyz(ctx context.Context, client *http.Client, url, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("build readyz request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz answered %s", resp.Status)
	}
	return nil
}
