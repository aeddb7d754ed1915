package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Files written for callers. They describe one running instance, so they are
// removed at startup (a stale one would point at a dead port) and at exit.
const (
	kubeconfigFile    = "kubeconfig"
	infoFile          = "apiserver.json"
	kcmKubeconfigFile = "controller-manager.kubeconfig"
)

// instanceInfo is the content of apiserver.json.
type instanceInfo struct {
	Port           int    `json:"port"`
	EtcdClientPort int    `json:"etcdClientPort"`
	Kubeconfig     string `json:"kubeconfig"`
	PID            int    `json:"pid"`
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// writeFileAtomic writes to a temp file in the same directory and renames it
// into place, so a reader never sees a partial file.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temp file for %s: %w", path, err)
	}
	tmpName := tmp.Name()
	defer os.Remove(tmpName) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", tmpName, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("chmod %s: %w", tmpName, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmpName, err)
	}
	if err := os.Rename(tmpName, path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmpName, path, err)
	}
	return nil
}

// removeInstanceFiles deletes the per-instance files, ignoring missing ones.
func removeInstanceFiles(dir string) error {
	var errs []error
	for _, name := range []string{kubeconfigFile, infoFile, kcmKubeconfigFile} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// freeLoopbackPort asks the OS for an unused port on 127.0.0.1. There is a
// short window in which another process could take it; etcd only accepts
// URLs, not listeners, so that window cannot be closed for its ports.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// pickPort returns want if it is set, else a free loopback port.
func pickPort(want int) (int, error) {
	if want != 0 {
		return want, nil
	}
	return freeLoopbackPort()
}

// buildKubeconfig returns a kubeconfig for a bearer-token user, with the CA
// embedded so the file stands alone.
func buildKubeconfig(server string, caPEM []byte, user, token string) ([]byte, error) {
	const name = "twc-sandbox"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: user, Namespace: "default"}
	cfg.CurrentContext = name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("serialize kubeconfig: %w", err)
	}
	return data, nil
}

func writeKubeconfig(path, server string, caPEM []byte, user, token string) error {
	data, err := buildKubeconfig(server, caPEM, user, token)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(path, data, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

func writeInstanceInfo(path string, info instanceInfo) error {
	data, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	if err := writeFileAtomic(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write instance info: %w", err)
	}
	return nil
}
