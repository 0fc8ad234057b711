package commands

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pgdurable/pgdurable/engine/httpapi"
	"github.com/pgdurable/pgdurable/engine/webui"
)

func (g *global) uiSessionsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "ui-sessions", Short: "The browsers signed in to the web UI"}
	revoke := &cobra.Command{
		Use:   "revoke",
		Short: "Sign every browser out of the web UI (sign out everywhere)",
		Long: `Ends every web UI session kept in the database: each browser signed in to any engine
process on it must sign in again with the API token. Do it when a laptop is lost or someone
leaves; after a token leaked, restart with a new token, which ends the old token's sessions
by itself (a session works only with the token it was opened with), and revoke to be sure.
The web UI's "Sign out everywhere" button does the same.

Works on the database, or over a running server's HTTP API with --address
(POST /v1/ui-sessions/revoke, with the API token). Prints how many live sessions it ended;
--json prints {"revoked": N}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := g.revokeUISessions(cmd.Context())
			if err != nil {
				return err
			}
			if g.jsonOut {
				return writeJSON(g.opts.Stdout, httpapi.UISessionsRevoked{Revoked: n})
			}
			fmt.Fprintf(g.opts.Stdout, "signed out everywhere: %d web UI session(s) ended; every browser must sign in again\n", n)
			return nil
		},
	}
	cmd.AddCommand(revoke)
	return cmd
}

// revokeUISessions ends every web UI session: over the API with an
// address, else on the database.
func (g *global) revokeUISessions(ctx context.Context) (int64, error) {
	if g.address() != "" {
		c, err := g.apiClient()
		if err != nil {
			return 0, err
		}
		var res httpapi.UISessionsRevoked
		err = c.do(ctx, "POST", "/v1/ui-sessions/revoke", nil, []byte("{}"), nil, &res)
		return res.Revoked, err
	}
	pool, err := g.pool(ctx, 1)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	return webui.RevokeSessions(ctx, pool, g.schema())
}
