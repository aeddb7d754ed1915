// Command twc-apiserver runs a real kube-apiserver backed by an embedded etcd,
// plus the garbage collector, namespace and service-account controllers of
// kube-controller-manager, all in one process bound to 127.0.0.1.
// It is the Kubernetes control plane of the project's tests and dev sandbox.
//
// Callers wait for DIR/kubeconfig to appear: it is written (atomically) only
// once /readyz answers, and removed again when the process stops.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

const (
	kcmStopTimeout       = 20 * time.Second
	apiserverStopTimeout = 60 * time.Second
)

type options struct {
	dir                 string
	port                int
	etcdPort            int
	etcdPeerPort        int
	verbosity           int
	noControllerManager bool
	etcdFsync           bool
	apiserverArgs       stringList
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("twc-apiserver", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: twc-apiserver --dir DIR [flags]\n\n"+
			"Runs kube-apiserver + embedded etcd (+ four kube-controller-manager controllers) on 127.0.0.1.\n"+
			"DIR/kubeconfig and DIR/apiserver.json appear once the API server is ready.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.dir, "dir", "", "state directory (certs, tokens, etcd data, kubeconfig); required")
	fs.IntVar(&o.port, "port", 0, "kube-apiserver HTTPS port on 127.0.0.1 (0 = a free port)")
	fs.IntVar(&o.etcdPort, "etcd-port", 0, "etcd client port on 127.0.0.1 (0 = a free port)")
	fs.IntVar(&o.etcdPeerPort, "etcd-peer-port", 0, "etcd peer port on 127.0.0.1 (0 = a free port)")
	fs.IntVar(&o.verbosity, "v", 1, "log verbosity (klog -v)")
	fs.BoolVar(&o.noControllerManager, "no-controller-manager", false, "do not run the controllers")
	fs.BoolVar(&o.etcdFsync, "etcd-fsync", false, "make etcd fsync its writes (off by default: faster, and only a machine crash can lose data)")
	fs.Var(&o.apiserverArgs, "apiserver-arg", "extra kube-apiserver flag, e.g. --apiserver-arg=--event-ttl=5m (repeatable; overrides the defaults)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if o.dir == "" {
		return nil, errors.New("--dir is required")
	}
	return o, nil
}

// setupLogging sends klog to stderr at the chosen verbosity. klog's own flags
// are kept off the command line: only -v matters here.
func setupLogging(verbosity int) error {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if err := fs.Set("v", strconv.Itoa(verbosity)); err != nil {
		return fmt.Errorf("set log verbosity: %w", err)
	}
	return nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "twc-apiserver:", err)
		os.Exit(2)
	}
	if err := setupLogging(o.verbosity); err != nil {
		fmt.Fprintln(os.Stderr, "twc-apiserver:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithCancel(context.Background())
	handleSignals(cancel)
	err = run(ctx, o)
	cancel()
	if err != nil {
		klog.ErrorS(err, "twc-apiserver failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.InfoS("twc-apiserver stopped")
	klog.Flush()
}

// handleSignals cancels on the first SIGINT/SIGTERM, which starts an orderly
// shutdown; a second one exits at once for when that shutdown hangs.
func handleSignals(cancel context.CancelFunc) {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-ch
		klog.InfoS("Shutting down", "signal", sig.String())
		cancel()
		sig = <-ch
		klog.InfoS("Second signal, exiting immediately", "signal", sig.String())
		klog.Flush()
		os.Exit(1)
	}()
}

// run starts etcd, the apiserver and the controller manager, publishes the
// kubeconfig, and on ctx cancellation stops them in reverse order.
func run(ctx context.Context, o *options) error {
	started := time.Now()
	dir, unlock, err := prepareDir(o.dir)
	if err != nil {
		return err
	}
	defer unlock()

	p, err := ensurePKI(dir)
	if err != nil {
		return fmt.Errorf("prepare certificates and tokens: %w", err)
	}

	etcdClientPort, err := pickPort(o.etcdPort)
	if err != nil {
		return err
	}
	etcdPeerPort, err := pickPort(o.etcdPeerPort)
	if err != nil {
		return err
	}
	etcd, err := startEtcd(filepath.Join(dir, "etcd"), etcdClientPort, etcdPeerPort, o.etcdFsync)
	if err != nil {
		return err
	}
	defer func() {
		etcd.stop()
		klog.InfoS("etcd stopped")
	}()
	klog.InfoS("etcd ready", "clientPort", etcdClientPort, "elapsed", since(started))

	srv, err := newAPIServer(ctx, p, o.port, etcdClientPort, o.apiserverArgs)
	if err != nil {
		return err
	}
	// Configured before anything runs, so that a bad flag fails at once.
	kcm, err := prepareControllerManager(o, p, srv.url())
	if err != nil {
		srv.listener.Close()
		return err
	}
	apiCtx, stopAPI := context.WithCancel(context.Background())
	apiTask := startTask("kube-apiserver", func() error { return srv.run(apiCtx) })
	defer stopTask(apiTask, stopAPI, apiserverStopTimeout)

	if err := waitReady(ctx, srv.url(), p.caPEM, p.adminToken, apiTask.done); err != nil {
		if ctx.Err() != nil {
			return nil // asked to stop while starting: not a failure
		}
		if apiTask.finished() {
			return fmt.Errorf("kube-apiserver stopped before it was ready: %v", apiTask.err)
		}
		return err
	}
	klog.InfoS("kube-apiserver ready", "url", srv.url(), "elapsed", since(started))

	kcmTask, stopKCM := startControllerManager(kcm)
	defer stopTask(kcmTask, stopKCM, kcmStopTimeout)

	if err := publish(dir, p, srv, etcdClientPort); err != nil {
		return err
	}
	defer func() {
		if err := removeInstanceFiles(dir); err != nil {
			klog.ErrorS(err, "Removing instance files")
		}
	}()
	klog.InfoS("Ready", "kubeconfig", filepath.Join(dir, kubeconfigFile), "elapsed", since(started))

	select {
	case <-ctx.Done():
		return nil
	case <-apiTask.done:
		return fmt.Errorf("kube-apiserver exited unexpectedly: %v", apiTask.err)
	case <-kcmTask.doneOrNever():
		return fmt.Errorf("kube-controller-manager exited unexpectedly: %v", kcmTask.err)
	}
}

// prepareDir makes DIR absolute, creates it, locks it against a second
// instance (which would fight over etcd data and the kubeconfig) and removes
// files left behind by a previous instance.
func prepareDir(dir string) (string, func(), error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", nil, fmt.Errorf("resolve --dir %q: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return "", nil, fmt.Errorf("create state dir: %w", err)
	}
	unlock, err := lockDir(abs)
	if err != nil {
		return "", nil, err
	}
	if err := removeInstanceFiles(abs); err != nil {
		unlock()
		return "", nil, fmt.Errorf("remove stale instance files: %w", err)
	}
	return abs, unlock, nil
}

func lockDir(dir string) (func(), error) {
	path := filepath.Join(dir, ".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("state dir %s is in use by another twc-apiserver: %w", dir, err)
	}
	return func() { f.Close() }, nil // closing releases the lock
}

// prepareControllerManager writes the controller manager's kubeconfig and
// builds its configuration; nil when it is disabled.
func prepareControllerManager(o *options, p *pki, server string) (*controllerManager, error) {
	if o.noControllerManager {
		return nil, nil
	}
	if err := writeKubeconfig(p.path(kcmKubeconfigFile), server, p.caPEM, kcmUser, p.kcmToken); err != nil {
		return nil, fmt.Errorf("controller-manager kubeconfig: %w", err)
	}
	return newControllerManager(p)
}

// startControllerManager runs the controller manager if it is configured. A
// disabled one is a nil task, which never finishes.
func startControllerManager(m *controllerManager) (*task, context.CancelFunc) {
	if m == nil {
		return nil, func() {}
	}
	kcmCtx, stop := context.WithCancel(context.Background())
	t := startTask("kube-controller-manager", func() error { return m.run(kcmCtx) })
	return t, stop
}

// publish writes apiserver.json, then the admin kubeconfig last: its
// appearance is the signal that everything above is ready.
func publish(dir string, p *pki, srv *apiserver, etcdClientPort int) error {
	kubeconfig := filepath.Join(dir, kubeconfigFile)
	info := instanceInfo{Port: srv.port, EtcdClientPort: etcdClientPort, Kubeconfig: kubeconfig, PID: os.Getpid()}
	if err := writeInstanceInfo(filepath.Join(dir, infoFile), info); err != nil {
		return err
	}
	return writeKubeconfig(kubeconfig, srv.url(), p.caPEM, adminUser, p.adminToken)
}

func since(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() }
