package main

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const etcdStartTimeout = 60 * time.Second

func loopbackURL(scheme string, port int) url.URL {
	return url.URL{Scheme: scheme, Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
}

// embeddedEtcd is a running in-process etcd.
type embeddedEtcd struct {
	etcd     *embed.Etcd
	logLevel zap.AtomicLevel
}

// startEtcd runs a single-member etcd inside this process and waits until it
// serves. Plain HTTP is enough: it listens on loopback only, and only the
// in-process apiserver talks to it.
func startEtcd(dataDir string, clientPort, peerPort int, fsync bool) (*embeddedEtcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = "twc-sandbox"
	cfg.Dir = dataDir
	client, peer := loopbackURL("http", clientPort), loopbackURL("http", peerPort)
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// Skipping fsync makes writes far cheaper. Data still survives a clean
	// stop or a killed process (the page cache keeps it); only a machine crash
	// can lose it, which does not matter for a test or sandbox store.
	cfg.UnsafeNoFsync = !fsync

	logger, level, err := newEtcdLogger()
	if err != nil {
		return nil, err
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(logger)

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd in %s: %w", dataDir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return &embeddedEtcd{etcd: e, logLevel: level}, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd failed while starting: %w", err)
	case <-time.After(etcdStartTimeout):
		e.Close()
		return nil, fmt.Errorf("etcd not ready after %s", etcdStartTimeout)
	}
}

// newEtcdLogger logs errors only: etcd reports every slow apply as a
// warning, which on a shared 2-core machine is constant noise. The level is
// adjustable so that stop can silence the errors etcd logs about its own
// listeners closing.
func newEtcdLogger() (*zap.Logger, zap.AtomicLevel, error) {
	level := zap.NewAtomicLevelAt(zapcore.ErrorLevel)
	zcfg := zap.NewProductionConfig()
	zcfg.Level = level
	zcfg.Encoding = "console"
	zcfg.DisableStacktrace = true
	zcfg.OutputPaths = []string{"stderr"}
	zcfg.ErrorOutputPaths = []string{"stderr"}
	logger, err := zcfg.Build()
	if err != nil {
		return nil, level, fmt.Errorf("build etcd logger: %w", err)
	}
	return logger.Named("etcd"), level, nil
}

// stop closes etcd. Closing makes etcd log "server closed" errors for each of
// its listeners; they are expected, so logging is turned down first.
func (e *embeddedEtcd) stop() {
	e.logLevel.SetLevel(zapcore.FatalLevel)
	e.etcd.Close()
}

// etcdClientURL is what the apiserver's --etcd-servers points at.
func etcdClientURL(port int) string {
	u := loopbackURL("http", port)
	return u.String()
}
