package regoplan

import (
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// The program's statements: ir's, with locals, constants and callees
// resolved. Each runs in the frame of its function (a slice of locals; nil
// is an undefined local).
type (
	block []instr
	instr any

	// operand is a local or, with local -1, a constant.
	operand struct {
		local int
		konst *ast.Term
	}

	// resultAdd adds the object in src to the result set; with a key,
	// the object {key: src} (the binding of a query of one variable,
	// which is not built unless Eval asks for it).
	resultAdd struct {
		src int
		key *ast.Term
	}
	returnLocal struct{ src int }
	blockStmt   struct{ blocks []block }
	breakStmt   struct{ index int }
	callFunc    struct {
		fn     *function
		args   []operand
		result int
	}
	callBuiltin struct {
		name     string
		f        topdown.BuiltinFunc
		relation bool // every output, in an array (walk)
		void     bool // no result: defined when it succeeds
		args     []operand
		result   int
	}
	assign struct {
		src operand
		dst int
	}
	assignOnce struct {
		src operand
		dst int
	}
	makeConst struct {
		v   *ast.Term // immutable: shared by every evaluation
		dst int
	}
	scan struct {
		src, key, value int
		body            block
	}
	// relationScan is a relation's call and the scan of its outputs.
	relationScan struct {
		call *callBuiltin
		scan *scan
	}
	not struct{ body block }
	dot struct {
		src, key operand
		dst      int
	}
	length struct {
		src operand
		dst int
	}
	equal struct {
		a, b operand
		not  bool
	}
	makeArray  struct{ capacity, dst int }
	makeObject struct{ dst int }
	makeSet    struct{ dst int }
	isKind     struct {
		src  operand
		kind int
	}
	isDefined struct {
		src int
		not bool
	}
	reset       struct{ dst int }
	arrayAppend struct {
		v   operand
		arr int
	}
	objectInsert struct {
		k, v operand
		obj  int
		once bool
	}
	setAdd struct {
		v   operand
		set int
	}
	with struct {
		local int
		path  []*ast.Term
		v     operand
		body  block
	}
)

const (
	kindArray = iota
	kindObject
	kindSet
)
