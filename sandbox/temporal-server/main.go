// twc-temporal-server: the Temporal server (go.temporal.io/server, the version go.mod pins)
// as the sandbox runs it next to the dev server, for tests that need TLS, mutual TLS, JWT
// authorization and PostgreSQL. One binary with three commands:
//
//	start --config-file <yaml>   all services (frontend, internal-frontend, history, matching,
//	                             worker) in one process, with the default authorizer (plus
//	                             a meaning for the worker role, authorizer.go) and the claim
//	                             mapper below
//	setup-schema <sql flags>     create the temporal and temporal_visibility databases and bring
//	                             their schemas (embedded in the server module) to the latest version
//	sql-tool <args>              temporal-sql-tool, as released
//
// Claims: a request with an Authorization header gets the claims of its JWT (the server's
// default JWT claim mapper: `permissions` like "default:write", "system:admin"). A request
// without one gets the permissions named by the organizational units (OU) of its verified
// client certificate, in the same "<namespace>:<role>" form, several separated by spaces; a
// certificate without such OUs grants nothing. The CA that signs client certificates is thereby the authority for mTLS
// identities, as the JWKS is for API keys.
package main

import (
	"fmt"
	"os"
	"strings"
	_ "time/tzdata" // embed tzdata as a fallback

	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/log/tag"
	_ "go.temporal.io/server/common/persistence/sql/sqlplugin/postgresql" // the postgres12 plugin
	"go.temporal.io/server/temporal"
	"go.temporal.io/server/tools/sql"
)

// services are the services `start` runs. internal-frontend serves the server's own system
// workers (worker deployments, schedulers, ...) without the authorizer.
var services = []string{"frontend", "internal-frontend", "history", "matching", "worker"}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: twc-temporal-server start --config-file <yaml> | setup-schema <sql-tool flags> | sql-tool <args>")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "start":
		err = start(os.Args[2:])
	case "setup-schema":
		err = setupSchema(os.Args[2:])
	case "sql-tool":
		err = sql.RunTool(append([]string{"temporal-sql-tool"}, os.Args[2:]...))
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "twc-temporal-server:", err)
		os.Exit(1)
	}
}

func start(args []string) error {
	if len(args) != 2 || args[0] != "--config-file" {
		return fmt.Errorf("usage: start --config-file <yaml>")
	}
	cfg, err := config.Load(config.WithConfigFile(args[1]))
	if err != nil {
		return fmt.Errorf("loading %s: %w", args[1], err)
	}
	logger := log.NewZapLogger(log.BuildZapLogger(cfg.Log))
	authorizer, err := authorization.GetAuthorizerFromConfig(&cfg.Global.Authorization)
	if err != nil {
		return fmt.Errorf("authorizer: %w", err)
	}
	jwtMapper, err := authorization.GetClaimMapperFromConfig(&cfg.Global.Authorization, logger)
	if err != nil {
		return fmt.Errorf("claim mapper: %w", err)
	}
	audienceMapper, err := authorization.GetAudienceMapperFromConfig(&cfg.Global.Authorization)
	if err != nil {
		return fmt.Errorf("audience mapper: %w", err)
	}
	mapper := &certOrJWTClaimMapper{jwt: jwtMapper, logger: logger}
	server, err := temporal.NewServer(
		temporal.ForServices(services),
		temporal.WithConfig(cfg),
		temporal.WithLogger(logger),
		temporal.InterruptOn(temporal.InterruptCh()),
		temporal.WithAuthorizer(newWorkerAwareAuthorizer(authorizer)),
		temporal.WithClaimMapper(func(*config.Config) authorization.ClaimMapper { return mapper }),
		temporal.WithAudienceGetter(func(*config.Config) authorization.JWTAudienceMapper { return audienceMapper }),
	)
	if err != nil {
		return fmt.Errorf("creating the server: %w", err)
	}
	return server.Start()
}

// certOrJWTClaimMapper maps a JWT with the default mapper, and a request without one by its
// client certificate's OUs.
type certOrJWTClaimMapper struct {
	jwt    authorization.ClaimMapper
	logger log.Logger
}

func (m *certOrJWTClaimMapper) GetClaims(info *authorization.AuthInfo) (*authorization.Claims, error) {
	if info.AuthToken != "" || info.TLSSubject == nil {
		return m.jwt.GetClaims(info)
	}
	claims := &authorization.Claims{Subject: info.TLSSubject.CommonName, AuthType: "mtls"}
	var permissions []string
	for _, unit := range info.TLSSubject.OrganizationalUnit {
		permissions = append(permissions, strings.Fields(unit)...)
	}
	for _, granted := range permissions {
		namespace, permission, ok := strings.Cut(granted, ":")
		if !ok {
			m.logger.Warn("ignoring certificate permission that is not <namespace>:<role>", tag.Value(granted))
			continue
		}
		role := roleOf(permission)
		if namespace == "system" {
			claims.System |= role
			continue
		}
		if claims.Namespaces == nil {
			claims.Namespaces = map[string]authorization.Role{}
		}
		claims.Namespaces[namespace] |= role
	}
	return claims, nil
}

// roleOf reads a role as the default JWT claim mapper does.
func roleOf(permission string) authorization.Role {
	switch strings.ToLower(permission) {
	case "read":
		return authorization.RoleReader
	case "write":
		return authorization.RoleWriter
	case "worker":
		return authorization.RoleWorker
	case "admin":
		return authorization.RoleAdmin
	}
	return authorization.RoleUndefined
}

// setupSchema creates both databases and applies the embedded postgres12 schemas, in this
// process (one start instead of six). args are the connection flags of temporal-sql-tool
// (--ep, --p, --u, --pw, --pl), without --db.
func setupSchema(args []string) error {
	for _, db := range []struct{ name, schema string }{
		{"temporal", "postgresql/v12/temporal"},
		{"temporal_visibility", "postgresql/v12/visibility"},
	} {
		for _, command := range [][]string{
			{"create-database"},
			{"setup-schema", "-v", "0.0"},
			{"update-schema", "--schema-name", db.schema},
		} {
			argv := append([]string{"temporal-sql-tool"}, args...)
			argv = append(argv, "--db", db.name)
			argv = append(argv, command...)
			if err := sql.RunTool(argv); err != nil {
				return fmt.Errorf("%s on %s: %w", command[0], db.name, err)
			}
		}
	}
	return nil
}
