package leasehold

import (
	"encoding/json"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// jsonKinds are the JSON types a schema allows ("number" for an integer).
func jsonKinds(doc map[string]interface{}, schema map[string]interface{}) map[string]bool {
	out := map[string]bool{}
	if ref, ok := schema["$ref"].(string); ok {
		parts := strings.Split(ref, "/")
		target := doc["components"].(map[string]interface{})["schemas"].(map[string]interface{})[parts[len(parts)-1]]
		return jsonKinds(doc, target.(map[string]interface{}))
	}
	for _, alt := range []string{"oneOf", "anyOf"} {
		if list, ok := schema[alt].([]interface{}); ok {
			for _, s := range list {
				for k := range jsonKinds(doc, s.(map[string]interface{})) {
					out[k] = true
				}
			}
			return out
		}
	}
	var types []interface{}
	switch t := schema["type"].(type) {
	case string:
		types = []interface{}{t}
	case []interface{}:
		types = t
	}
	if len(types) == 0 && schema["properties"] != nil {
		types = []interface{}{"object"}
	}
	for _, t := range types {
		if t == "integer" {
			t = "number"
		}
		out[t.(string)] = true
	}
	return out
}

// goKind is the JSON type a Go field decodes, and whether it can hold
// null (a pointer).
func goKind(t reflect.Type) (string, bool) {
	nullable := false
	if t.Kind() == reflect.Ptr {
		t, nullable = t.Elem(), true
	}
	switch t.Kind() {
	case reflect.String:
		return "string", nullable
	case reflect.Bool:
		return "boolean", nullable
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint, reflect.Uint64, reflect.Uint32, reflect.Float64:
		return "number", nullable
	case reflect.Slice:
		return "array", nullable
	case reflect.Struct, reflect.Map:
		return "object", nullable
	}
	return t.String(), nullable
}

// The wire types the client reads against the OpenAPI document the node
// serves: each field is in its schema with the same JSON type, a field the
// client cannot do without (no omitempty, no pointer) is one the schema
// requires, a field the schema lets be null is a pointer here, and each
// field the schema requires is one the client knows.
func TestTheWireTypesAgreeWithTheOpenAPIDocument(t *testing.T) {
	n := startNode(t)
	r, err := http.Get(n.url() + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var doc map[string]interface{}
	if err := json.NewDecoder(r.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	schemas := doc["components"].(map[string]interface{})["schemas"].(map[string]interface{})
	keepalive := doc["paths"].(map[string]interface{})["/v1/leases/{id}/keepalive"].(map[string]interface{})["post"].(map[string]interface{})["responses"].(map[string]interface{})["200"].(map[string]interface{})["content"].(map[string]interface{})["application/json"].(map[string]interface{})["schema"]
	types := map[string]reflect.Type{
		"Lock": reflect.TypeOf(Lock{}), "Holder": reflect.TypeOf(Holder{}), "Waiter": reflect.TypeOf(Waiter{}),
		"Acquired": reflect.TypeOf(acquired{}), "Granted": reflect.TypeOf(granted{}),
		"WatchEvent": reflect.TypeOf(watchEvent{}), "keepAlive": reflect.TypeOf(renewed{}),
	}
	var problems []string
	for name, typ := range types {
		schema, _ := schemas[name].(map[string]interface{})
		if name == "keepAlive" {
			schema = keepalive.(map[string]interface{})
		}
		if schema == nil {
			problems = append(problems, name+": no such schema")
			continue
		}
		props, _ := schema["properties"].(map[string]interface{})
		required := map[string]bool{}
		if list, ok := schema["required"].([]interface{}); ok {
			for _, f := range list {
				required[f.(string)] = true
			}
		}
		known := map[string]bool{}
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			tag := strings.Split(f.Tag.Get("json"), ",")
			field := tag[0]
			known[field] = true
			theirs, ok := props[field].(map[string]interface{})
			if !ok {
				problems = append(problems, name+"."+field+": not in the schema")
				continue
			}
			kind, nullable := goKind(f.Type)
			optional := nullable || (len(tag) > 1 && tag[1] == "omitempty")
			allowed := jsonKinds(doc, theirs)
			if !allowed[kind] {
				problems = append(problems, name+"."+field+": "+kind+" here, not in the schema")
			}
			if allowed["null"] && !nullable {
				problems = append(problems, name+"."+field+": the schema lets it be null, the client cannot tell")
			}
			if !optional && !required[field] {
				problems = append(problems, name+"."+field+": the client needs it, the schema does not promise it")
			}
		}
		for field := range required {
			if !known[field] {
				problems = append(problems, name+"."+field+": required by the schema, unknown here")
			}
		}
	}
	sort.Strings(problems)
	if len(problems) > 0 {
		t.Fatalf("the client and the OpenAPI document disagree:\n%s", strings.Join(problems, "\n"))
	}
}
