package leasehold

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Placeholder is how a database/sql driver writes its parameters.
type Placeholder int

const (
	// Dollar is PostgreSQL's: $1, $2, ...
	Dollar Placeholder = iota
	// Question is MySQL's and SQLite's: ?.
	Question
)

// Execer is what FencedUpdate needs: a *sql.DB, *sql.Tx or *sql.Conn.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...interface{}) (sql.Result, error)
}

var plainName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

// FencedUpdate is the resource's half of fencing for a SQL row that keeps
// the highest token it has seen in fenceColumn: it runs
//
//	UPDATE table SET col = $1, ..., fence = $n WHERE key = $m ... AND fence <= $n
//
// and answers the rows changed, or an error that is ErrStaleFence when none
// was (the row has seen a newer token, or does not exist). Use <= so a
// holder may write more than once with its own token. table and the column
// names are written into the SQL: they must come from your code (they are
// checked to be plain names); values always go as parameters.
func FencedUpdate(ctx context.Context, db Execer, style Placeholder, table string,
	values, where map[string]interface{}, fenceColumn string, fence uint64) (int64, error) {
	names := []string{table, fenceColumn}
	setCols, whereCols := sortedKeys(values), sortedKeys(where)
	names = append(append(names, setCols...), whereCols...)
	for _, n := range names {
		if !plainName.MatchString(n) {
			return 0, errorf("invalid_argument", "%q is not a plain SQL name", n)
		}
	}
	var args []interface{}
	param := func(v interface{}) string {
		args = append(args, v)
		if style == Question {
			return "?"
		}
		return fmt.Sprintf("$%d", len(args))
	}
	var sets, conds []string
	for _, c := range setCols {
		sets = append(sets, fmt.Sprintf("%s = %s", c, param(values[c])))
	}
	sets = append(sets, fmt.Sprintf("%s = %s", fenceColumn, param(int64(fence))))
	for _, c := range whereCols {
		conds = append(conds, fmt.Sprintf("%s = %s", c, param(where[c])))
	}
	conds = append(conds, fmt.Sprintf("%s <= %s", fenceColumn, param(int64(fence))))
	query := fmt.Sprintf("UPDATE %s SET %s WHERE %s", table, strings.Join(sets, ", "), strings.Join(conds, " AND "))
	result, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	n, err := result.RowsAffected()
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, &Error{Code: "stale_fence", Message: fmt.Sprintf("%s: no row matched %v with %s <= %d", table, where, fenceColumn, fence),
			Details: map[string]interface{}{"presented_fence": fence}}
	}
	return n, nil
}

func sortedKeys(m map[string]interface{}) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
