package commands_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/pgdurable/pgdurable/cmd/engine/commands"
	"github.com/pgdurable/pgdurable/engine/enginetest"
)

// A command added with Options.Commands sees the global flags, streams and
// database through Env, and its misuse exits 2 as a built-in command's
// does. Without the payment commands, demo is an unknown command.
func TestOptionsCommands(t *testing.T) {
	t.Parallel()
	db := enginetest.NewDB(t)
	probe := func(env *commands.Env) *cobra.Command {
		cmd := &cobra.Command{Use: "probe", Args: cobra.NoArgs}
		refuse := cmd.Flags().Bool("refuse", false, "fail as a usage error")
		own := cmd.Flags().Bool("own", false, "require a database of its own")
		cmd.RunE = func(cmd *cobra.Command, _ []string) error {
			if *refuse {
				return commands.UsageError(errors.New("probe refuses"))
			}
			if *own {
				if err := env.OwnDatabase("probe"); err != nil {
					return err
				}
			}
			pool, err := env.Pool(cmd.Context(), 1)
			if err != nil {
				return err
			}
			defer pool.Close()
			var db string
			if err := pool.QueryRow(cmd.Context(), `SELECT current_database()`).Scan(&db); err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			fmt.Fprintf(env.Stdout(), "db=%s flag=%q env=%q self=%v\n", db, env.DatabaseFlag(), env.Getenv("PROBE"), env.ServeCommand("serve").Path == self)
			fmt.Fprintln(env.Stderr(), "to stderr")
			env.SetDatabaseURL("postgres://postgres@127.0.0.1:1/elsewhere")
			fmt.Fprintf(env.Stdout(), "now %s\n", env.DatabaseURL())
			return nil
		}
		return cmd
	}
	exec := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := commands.Execute(context.Background(), args, commands.Options{Stdout: &out, Stderr: &errOut,
			Getenv:   func(k string) string { return map[string]string{"PROBE": "p"}[k] },
			Commands: []func(*commands.Env) *cobra.Command{probe, func(*commands.Env) *cobra.Command { return nil }}})
		return code, out.String(), errOut.String()
	}
	code, out, errOut := exec("--database-url", db.URL, "probe")
	require.Equal(t, 0, code, errOut)
	var name string
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&name))
	require.Equal(t, fmt.Sprintf("db=%s flag=%q env=\"p\" self=true\nnow postgres://postgres@127.0.0.1:1/elsewhere\n", name, db.URL), out)
	require.Equal(t, "to stderr\n", errOut)

	code, _, errOut = exec("--database-url", db.URL, "probe", "extra")
	require.Equal(t, 2, code, "a wrong number of arguments is a usage error")
	require.Contains(t, errOut, "unknown command")
	code, _, errOut = exec("probe", "--refuse")
	require.Equal(t, 2, code)
	require.Equal(t, "error: probe refuses\n", errOut)
	code, out, _ = exec("--json", "probe", "--refuse")
	require.Equal(t, 2, code)
	var body struct {
		Error struct{ Code, Message string }
	}
	require.NoError(t, json.Unmarshal([]byte(out), &body), out)
	require.Equal(t, "usage", body.Error.Code)
	require.Equal(t, "probe refuses", body.Error.Message)
	code, _, errOut = exec("probe", "--own")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "engine probe fills its database")

	code, _, errOut = exec("demo")
	require.Equal(t, 2, code, "demo comes with paymentcmd, not with commands")
	require.Contains(t, errOut, `unknown command "demo"`)
}
