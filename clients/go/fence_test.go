package leasehold

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// psqlDriver is a database/sql driver for these tests only: it runs each
// statement on the real PostgreSQL through psql (the standard library has
// no driver, and the client takes no module), as a prepared statement with
// its parameters, so $1, $2 ... are PostgreSQL's own.
type psqlDriver struct{}

type psqlConn struct{ dsn []string }

func (psqlDriver) Open(name string) (driver.Conn, error) { return psqlConn{strings.Fields(name)}, nil }
func (c psqlConn) Prepare(query string) (driver.Stmt, error) {
	return psqlStmt{c, query}, nil
}
func (psqlConn) Close() error              { return nil }
func (psqlConn) Begin() (driver.Tx, error) { return nil, errors.New("no transactions here") }

type psqlStmt struct {
	c     psqlConn
	query string
}

func (psqlStmt) Close() error  { return nil }
func (psqlStmt) NumInput() int { return -1 }
func (s psqlStmt) Query([]driver.Value) (driver.Rows, error) {
	return nil, errors.New("no queries here")
}

func literal(v driver.Value) string {
	switch x := v.(type) {
	case int64:
		return strconv.FormatInt(x, 10)
	case string:
		return "'" + strings.ReplaceAll(x, "'", "''") + "'"
	}
	return fmt.Sprintf("'%v'", v)
}

func (s psqlStmt) Exec(args []driver.Value) (driver.Result, error) {
	var lits []string
	for _, a := range args {
		lits = append(lits, literal(a))
	}
	sql := fmt.Sprintf("PREPARE s AS %s; EXECUTE s(%s);", s.query, strings.Join(lits, ", "))
	out, err := exec.Command("psql", append(s.c.dsn, "-X", "-v", "ON_ERROR_STOP=1", "-c", sql)...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("psql: %v: %s", err, out)
	}
	fields := strings.Fields(string(out))
	n, _ := strconv.ParseInt(fields[len(fields)-1], 10, 64)
	return driver.RowsAffected(n), nil
}

func init() { sql.Register("psql-for-tests", psqlDriver{}) }

func psql(t *testing.T, dsn []string, statement string) {
	t.Helper()
	if out, err := exec.Command("psql", append(dsn, "-X", "-v", "ON_ERROR_STOP=1", "-c", statement)...).CombinedOutput(); err != nil {
		t.Fatalf("psql %s: %v: %s", statement, err, out)
	}
}

// FencedUpdate on a real PostgreSQL row: a write with the row's token or a
// newer one lands, an older one is refused and changes nothing.
func TestFencedUpdateRefusesAnOlderTokenOnPostgreSQL(t *testing.T) {
	if _, err := exec.LookPath("psql"); err != nil {
		t.Skip("psql is not installed")
	}
	dsn := []string{"-h", "127.0.0.1", "-U", "root", "-d", "test"}
	table := fmt.Sprintf("fenced_%d", freePort(t))
	psql(t, dsn, fmt.Sprintf("CREATE TABLE %s (id int primary key, balance int, fence bigint)", table))
	defer psql(t, dsn, "DROP TABLE "+table)
	psql(t, dsn, fmt.Sprintf("INSERT INTO %s VALUES (1, 100, 0)", table))
	db, err := sql.Open("psql-for-tests", strings.Join(dsn, " "))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	where := map[string]interface{}{"id": 1}
	if n, err := FencedUpdate(ctx, db, Dollar, table, map[string]interface{}{"balance": 90}, where, "fence", 7); err != nil || n != 1 {
		t.Fatalf("token 7: %d %v", n, err)
	}
	if n, err := FencedUpdate(ctx, db, Dollar, table, map[string]interface{}{"balance": 80}, where, "fence", 7); err != nil || n != 1 {
		t.Fatalf("token 7 again: %d %v", n, err)
	}
	if _, err := FencedUpdate(ctx, db, Dollar, table, map[string]interface{}{"balance": 0}, where, "fence", 6); !errors.Is(err, ErrStaleFence) {
		t.Fatalf("token 6 after 7: %v", err)
	}
	out, err := exec.Command("psql", append(dsn, "-X", "-t", "-A", "-c", "SELECT balance, fence FROM "+table)...).Output()
	if err != nil || strings.TrimSpace(string(out)) != "80|7" {
		t.Fatalf("the row: %q %v", out, err)
	}
	if _, err := FencedUpdate(ctx, db, Dollar, table+"; DROP TABLE x", nil, where, "fence", 8); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a name that is not plain: %v", err)
	}
}
