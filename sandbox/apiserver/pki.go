package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Names of the files kept in the state dir. They survive restarts so that a
// restarted server accepts the same tokens and trusts the same CA.
const (
	caCertFile      = "ca.crt"
	caKeyFile       = "ca.key"
	servingCertFile = "apiserver.crt"
	servingKeyFile  = "apiserver.key"
	saKeyFile       = "sa.key"
	saPubFile       = "sa.pub"
	tokenFile       = "tokens.csv"
)

// Identities in the static token file. Both are in system:masters: the
// controller manager runs its controllers with its own client (no per-controller
// service account credentials), so it needs rights over every resource the
// garbage collector may have to delete.
const (
	adminUser = "twc-admin"
	kcmUser   = "system:kube-controller-manager"
)

// pki is what the apiserver and the controller manager need from the state dir.
type pki struct {
	dir        string
	caPEM      []byte
	adminToken string
	kcmToken   string
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// ensurePKI loads the CA, serving cert, service-account keys and tokens from
// dir, generating whichever are missing.
func ensurePKI(dir string) (*pki, error) {
	caCert, caKey, caCreated, err := ensureCA(dir)
	if err != nil {
		return nil, err
	}
	// A serving cert left over from a previous CA would not verify.
	if err := ensureServingCert(dir, caCert, caKey, caCreated); err != nil {
		return nil, err
	}
	if err := ensureServiceAccountKeys(dir); err != nil {
		return nil, err
	}
	adminToken, kcmToken, err := ensureTokens(filepath.Join(dir, tokenFile))
	if err != nil {
		return nil, err
	}
	return &pki{
		dir:        dir,
		caPEM:      encodeCert(caCert),
		adminToken: adminToken,
		kcmToken:   kcmToken,
	}, nil
}

// ensureCA loads or creates the CA; created tells which.
func ensureCA(dir string) (cert *x509.Certificate, key crypto.Signer, created bool, err error) {
	certPath, keyPath := filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile)
	if fileExists(certPath) && fileExists(keyPath) {
		cert, key, err := loadCertAndKey(certPath, keyPath)
		if err != nil {
			return nil, nil, false, fmt.Errorf("load existing CA: %w", err)
		}
		return cert, key, false, nil
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, false, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl, err := certTemplate("twc-sandbox-ca")
	if err != nil {
		return nil, nil, false, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	cert, err = signCert(tmpl, tmpl, ecKey.Public(), ecKey)
	if err != nil {
		return nil, nil, false, fmt.Errorf("self-sign CA: %w", err)
	}
	if err := writeCertAndKey(certPath, keyPath, cert, ecKey); err != nil {
		return nil, nil, false, err
	}
	return cert, ecKey, true, nil
}

// ensureServingCert creates the apiserver's TLS certificate. Besides loopback
// it names the in-cluster service address and DNS names, so a client that was
// told the "kubernetes" service would also verify it.
func ensureServingCert(dir string, caCert *x509.Certificate, caKey crypto.Signer, force bool) error {
	certPath, keyPath := filepath.Join(dir, servingCertFile), filepath.Join(dir, servingKeyFile)
	if !force && fileExists(certPath) && fileExists(keyPath) {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate serving key: %w", err)
	}
	tmpl, err := certTemplate("kube-apiserver")
	if err != nil {
		return err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP(serviceIP)}
	tmpl.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	cert, err := signCert(tmpl, caCert, key.Public(), caKey)
	if err != nil {
		return fmt.Errorf("sign serving cert: %w", err)
	}
	return writeCertAndKey(certPath, keyPath, cert, key)
}

// ensureServiceAccountKeys creates the RSA pair that signs service-account
// tokens (RS256 is what every token consumer understands).
func ensureServiceAccountKeys(dir string) error {
	keyPath, pubPath := filepath.Join(dir, saKeyFile), filepath.Join(dir, saPubFile)
	if fileExists(keyPath) && fileExists(pubPath) {
		return nil
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generate service-account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return fmt.Errorf("marshal service-account public key: %w", err)
	}
	if err := writeKey(keyPath, key); err != nil {
		return err
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	if err := writeFileAtomic(pubPath, pubPEM, 0o644); err != nil {
		return fmt.Errorf("write service-account public key: %w", err)
	}
	return nil
}

// ensureTokens reads the admin and controller-manager tokens from the static
// token file (format: token,user,uid,"group1,group2"), creating it if needed.
func ensureTokens(path string) (admin, kcm string, err error) {
	data, err := os.ReadFile(path)
	if err == nil {
		return parseTokens(path, data)
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", "", fmt.Errorf("read token file: %w", err)
	}
	if admin, err = randomToken(); err != nil {
		return "", "", err
	}
	if kcm, err = randomToken(); err != nil {
		return "", "", err
	}
	content := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n%s,%s,%s,\"system:masters\"\n",
		admin, adminUser, adminUser, kcm, kcmUser, kcmUser)
	if err := writeFileAtomic(path, []byte(content), 0o600); err != nil {
		return "", "", fmt.Errorf("write token file: %w", err)
	}
	return admin, kcm, nil
}

func parseTokens(path string, data []byte) (admin, kcm string, err error) {
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.SplitN(strings.TrimSpace(line), ",", 3)
		if len(fields) < 2 {
			continue
		}
		switch fields[1] {
		case adminUser:
			admin = fields[0]
		case kcmUser:
			kcm = fields[0]
		}
	}
	if admin == "" || kcm == "" {
		return "", "", fmt.Errorf("token file %s lacks a token for %s or %s; delete it to regenerate", path, adminUser, kcmUser)
	}
	return admin, kcm, nil
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// certTemplate returns a template valid from an hour ago (tolerates clock
// skew between processes) for ten years: sandbox state dirs can live long.
func certTemplate(commonName string) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
	}, nil
}

func signCert(tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) (*x509.Certificate, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

func encodeCert(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

func writeCertAndKey(certPath, keyPath string, cert *x509.Certificate, key crypto.PrivateKey) error {
	// Key first: a cert without its key would be "reused" and fail later.
	if err := writeKey(keyPath, key); err != nil {
		return err
	}
	if err := writeFileAtomic(certPath, encodeCert(cert), 0o644); err != nil {
		return fmt.Errorf("write certificate %s: %w", certPath, err)
	}
	return nil
}

func writeKey(path string, key crypto.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("marshal private key %s: %w", path, err)
	}
	data := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	if err := writeFileAtomic(path, data, 0o600); err != nil {
		return fmt.Errorf("write private key %s: %w", path, err)
	}
	return nil
}

func loadCertAndKey(certPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", certPath, err)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, nil, fmt.Errorf("%s holds no PEM certificate", certPath)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse %s: %w", certPath, err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", keyPath, err)
	}
	block, _ = pem.Decode(keyPEM)
	if block == nil {
		return nil, nil, fmt.Errorf("%s holds no PEM key", keyPath)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse %s: %w", keyPath, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("%s: key of type %T cannot sign", keyPath, key)
	}
	return cert, signer, nil
}
