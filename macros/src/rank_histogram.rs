//! `#[rank_histogram(board = "...", score = "...", order, precision, layout,
//! histogram)]`: ranks of the model's scores on boards. The runtime's
//! `rank_histogram` module holds the pattern; this checks the options,
//! infers the board and the score when the struct leaves one choice, and
//! wires the two fields.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Attribute, DeriveInput, Expr, ExprLit, ExprUnary, Ident, Lit, LitStr, Meta, Type, UnOp};

use crate::ast::{Field, Input, Order};
use crate::attr::{self, Opt};
use crate::ctxt::Ctxt;
use crate::private::Private;

mod infer;

use infer::{infer, is_one_of, Other, BOARD_KIND, FLOATS, INTEGERS, SCORE_KIND};

const RANK: &str = "rank_histogram";
const BOARD: &str = "board";
const SCORE: &str = "score";
const ORDER: &str = "order";
const PRECISION: &str = "precision";
const LAYOUT: &str = "layout";
const HISTOGRAM: &str = "histogram";
const OPTIONS: &[&str] = &[BOARD, SCORE, ORDER, PRECISION, LAYOUT, HISTOGRAM];

/// How a histogram is stored, as `layout = "..."` spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Array,
    Documents,
}

impl Layout {
    const ALL: [Layout; 2] = [Layout::Array, Layout::Documents];

    fn spelling(self) -> &'static str {
        match self {
            Layout::Array => "array",
            Layout::Documents => "documents",
        }
    }
}

/// The variant's path under `__private`.
impl ToTokens for Layout {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.extend(match self {
            Layout::Array => quote!(Layout::Array),
            Layout::Documents => quote!(Layout::Documents),
        });
    }
}

/// What `#[rank_histogram]` says, as far as it could be read.
pub struct RankHistogram {
    /// The fields `board` and `score` name, found even when they cannot be
    /// used: after an error, the fallback keeps their types.
    named_board: Option<(Ident, Type)>,
    named_score: Option<Type>,
    /// The whole declaration; `None` after an error.
    spec: Option<Spec>,
}

struct Spec {
    board: (String, Ident, Type),
    score: (String, Ident, Type),
    order: Order,
    precision: Option<f64>,
    layout: Layout,
    histogram: String,
}

/// Parses `#[rank_histogram]` if present; `collection` is the players'.
/// Errors go to `cx`.
pub fn parse(
    cx: &Ctxt,
    input: &DeriveInput,
    model: &Input,
    collection: &str,
) -> Option<RankHistogram> {
    let attrs = attr::single(cx, &input.attrs, RANK)?;
    let mut out = RankHistogram {
        named_board: None,
        named_score: None,
        spec: None,
    };
    out.spec = parse_spec(cx, attrs[0], model, collection, &mut out);
    Some(out)
}

fn parse_spec(
    cx: &Ctxt,
    first: &Attribute,
    model: &Input,
    collection: &str,
    out: &mut RankHistogram,
) -> Option<Spec> {
    let mut board = Opt::new(cx, RANK, BOARD);
    let mut score = Opt::new(cx, RANK, SCORE);
    let mut order = Opt::new(cx, RANK, ORDER);
    let mut precision = Opt::new(cx, RANK, PRECISION);
    let mut layout = Opt::new(cx, RANK, LAYOUT);
    let mut histogram = Opt::new(cx, RANK, HISTOGRAM);
    match &first.meta {
        // The bare form infers everything.
        Meta::Path(_) => {}
        Meta::NameValue(nv) => {
            cx.error_spanned_by(
                nv,
                "`#[rank_histogram]` takes options in parentheses, as in `#[rank_histogram(board = \"examId\", score = \"score\")]`, or none",
            );
            return None;
        }
        Meta::List(_) => {
            let parsed = first.parse_nested_meta(|meta| {
                let name = attr::option_name(&meta);
                match name.as_str() {
                    // board = "field" | score = "field" | histogram = "name"
                    BOARD | SCORE | HISTOGRAM => {
                        let lit = attr::parse_lit_str(&meta, RANK)?;
                        let slot = match name.as_str() {
                            BOARD => &mut board,
                            SCORE => &mut score,
                            _ => &mut histogram,
                        };
                        slot.set(&lit, lit.clone());
                    }
                    // order = "desc" | "asc"
                    ORDER => {
                        let lit = attr::parse_lit_str(&meta, RANK)?;
                        let other = lit.value();
                        match Order::from_spelling(&other) {
                            Some(o) => order.set(&lit, o),
                            None => cx.error_spanned_by(
                                &lit,
                                format!(
                                    "unknown `rank_histogram` order `{other}`; expected `desc` (a higher score ranks first, the default) or `asc` (a lower score ranks first, as for a race time){}",
                                    attr::hint(&other, ["desc", "asc", "descending", "ascending"])
                                ),
                            ),
                        }
                    }
                    // layout = "array" | "documents"
                    LAYOUT => {
                        let lit = attr::parse_lit_str(&meta, RANK)?;
                        let other = lit.value();
                        match Layout::ALL.into_iter().find(|l| l.spelling() == other) {
                            Some(l) => layout.set(&lit, l),
                            None => cx.error_spanned_by(
                                &lit,
                                format!(
                                    "unknown `rank_histogram` layout `{other}`; expected `array` (one document per board, up to about 10,000 distinct scores) or `documents` (one document per board and score, for any number){}",
                                    attr::hint(&other, Layout::ALL.map(Layout::spelling))
                                ),
                            ),
                        }
                    }
                    // precision = 0.5
                    PRECISION => {
                        let value = attr::parse_value(&meta)?;
                        match precision_value(&value) {
                            Ok(p) => precision.set(&value, p),
                            Err(why) => cx.error_spanned_by(&value, why),
                        }
                    }
                    _ => {
                        cx.syn_error(attr::unknown_option(&meta, RANK, OPTIONS));
                        attr::skip_value(&meta)?;
                    }
                }
                Ok(())
            });
            let read = cx.ok(parsed).is_some();
            out.named_board = board
                .value()
                .and_then(|l| model.find(&l.value()))
                .map(|f| (f.ident.clone(), f.ty.clone()));
            out.named_score = score
                .value()
                .and_then(|l| model.find(&l.value()))
                .filter(|f| is_one_of(f.ty, INTEGERS) || is_one_of(f.ty, FLOATS))
                .map(|f| f.ty.clone());
            if !read {
                return None;
            }
        }
    }

    let board = board.get().map(|(_, l)| l);
    let score = score.get().map(|(_, l)| l);
    let resolve = |lit: &LitStr, option: &str| -> Option<&Field> {
        let f = model.resolve(cx, lit, RANK, option)?;
        if f.bson_name == "_id" {
            let why = if option == BOARD {
                "each player's document has its own `_id`, so every board would hold one player; name the field players share, such as an exam"
            } else {
                "a document's `_id` identifies it; name the field that holds the score"
            };
            let named = match lit.value() {
                v if v == "_id" => "`_id`".to_owned(),
                v => format!("`{v}` (stored as `_id`)"),
            };
            cx.error_spanned_by(
                lit,
                format!("`rank_histogram` option `{option}` names {named}: {why}"),
            );
            return None;
        }
        Some(f)
    };
    let explicit_board = board.as_ref().map(|l| resolve(l, BOARD));
    let explicit_score = score.as_ref().map(|l| resolve(l, SCORE));
    if let (Some(Some(b)), Some(Some(s)), Some(lit)) = (&explicit_board, &explicit_score, &score) {
        if b.bson_name == s.bson_name {
            cx.error_spanned_by(
                lit,
                format!("`rank_histogram` options `board` and `score` both name `{}`; the board groups players and the score ranks them, so they are two fields", b.bson_name),
            );
            return None;
        }
    }
    // Inference: a field left out is the one candidate of its kind.
    let score = match explicit_score {
        Some(s) => s,
        None => {
            let board = match explicit_board {
                None => Other::Open,
                Some(Some(b)) => Other::Is(b),
                Some(None) => Other::Failed,
            };
            infer(cx, first, model, &SCORE_KIND, &BOARD_KIND, board)
        }
    };
    let board = match explicit_board {
        Some(b) => b,
        None => {
            let score = score.map_or(Other::Failed, Other::Is);
            infer(cx, first, model, &BOARD_KIND, &SCORE_KIND, score)
        }
    };

    let histogram = match histogram.get() {
        Some((_, lit)) => {
            let name = lit.value();
            if let Some(why) = attr::bad_collection_name(&name) {
                cx.error_spanned_by(&lit, format!("invalid collection name: {why}"));
            } else if name == collection {
                cx.error_spanned_by(
                    &lit,
                    format!("`rank_histogram` option `histogram` names `{name}`, the collection of the players' documents; the histograms need a collection of their own"),
                );
            }
            name
        }
        None => format!("{collection}_ranks"),
    };
    let field = |f: &Field| (f.bson_name.clone(), f.ident.clone(), f.ty.clone());
    Some(Spec {
        board: field(board?),
        score: field(score?),
        order: order.get().map_or(Order::Desc, |(_, o)| o),
        precision: precision.get().map(|(_, p)| p),
        layout: layout.get().map_or(Layout::Array, |(_, l)| l),
        histogram,
    })
}

/// `precision = 0.5`: a positive, finite number literal.
fn precision_value(value: &Expr) -> Result<f64, String> {
    let positive = "`rank_histogram` option `precision` must be above 0: it is the step scores are rounded to, as in `precision = 0.5` or `precision = 0.01`";
    let parsed = match value {
        Expr::Lit(ExprLit {
            lit: Lit::Float(f), ..
        }) => f.base10_parse::<f64>().ok(),
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => i.base10_parse::<f64>().ok(),
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => return Err(positive.to_owned()),
        _ => return Err(
            "`rank_histogram` option `precision` takes a number literal, as in `precision = 0.5`"
                .to_owned(),
        ),
    };
    match parsed {
        Some(p) if p.is_finite() && p >= 1e-12 => Ok(p),
        Some(p) if p.is_finite() && p > 0.0 => Err(format!(
            "`rank_histogram` option `precision` = {p} is below 1e-12, finer than a double can tell apart at typical scores; leave `precision` out to rank exact values"
        )),
        Some(p) if p.is_finite() => Err(positive.to_owned()),
        _ => Err("`rank_histogram` option `precision` must be a finite number".to_owned()),
    }
}

impl RankHistogram {
    pub fn expand(&self, input: &DeriveInput, p: &Private) -> Option<TokenStream> {
        let spec = self.spec.as_ref()?;
        let ident = &input.ident;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        let (board_name, board_ident, board_ty) = &spec.board;
        let (score_name, score_ident, score_ty) = &spec.score;
        let descending = spec.order.is_descending();
        let precision = match spec.precision {
            Some(v) => quote!(#p::core::option::Option::Some(#v)),
            None => quote!(#p::core::option::Option::None),
        };
        let layout = spec.layout;
        let histogram = &spec.histogram;
        let board_p = p.at(board_ty.span());
        let board_check = quote_spanned! {board_ty.span()=>
            #board_p::assert_board_key::<#board_ty>();
        };
        let float_check = spec.precision.map(|_| {
            let p = p.at(score_ty.span());
            quote_spanned! {score_ty.span()=>
                #p::assert_float_score::<#score_ty>();
            }
        });
        // The associated types take the fields' spans, so that a bound they
        // miss is reported there once, and not again at the macro. `Score`'s
        // bound is `RankScore`, so it is the score's only type check: an
        // `assert_rank_score` as well would report the same error twice.
        let board_assoc = quote_spanned! {board_ty.span()=> type Board = #board_ty; };
        let score_assoc = quote_spanned! {score_ty.span()=> type Score = #score_ty; };
        Some(quote! {
            #[automatically_derived]
            impl #impl_g #p::RankHistogram for #ident #ty_g #where_g {
                #board_assoc
                #score_assoc
                const RANK: #p::RankSpec = #p::RankSpec {
                    board: #board_name,
                    score: #score_name,
                    descending: #descending,
                    precision: #precision,
                    layout: #p::#layout,
                    histogram: #histogram,
                };
                fn board(&self) -> &Self::Board {
                    &self.#board_ident
                }
                fn score(&self) -> Self::Score {
                    #p::core::clone::Clone::clone(&self.#score_ident)
                }
            }
            const _: () = {
                #[allow(dead_code)]
                fn __rank_fields #impl_g () #where_g { #board_check #float_check }
            };
        })
    }

    /// After an error in a `#[rank_histogram]` model, an impl that claims
    /// nothing, so that `Exam::ranks(&db)` elsewhere adds no error of its
    /// own. It keeps the types of the fields `board` and `score` name.
    pub fn fallback(&self, input: &DeriveInput, p: &Private) -> TokenStream {
        let (board_ty, board_ref) = match &self.named_board {
            Some((ident, ty)) => (quote!(#ty), quote!(&self.#ident)),
            None => (quote!(()), quote!(&())),
        };
        let score_ty = match &self.named_score {
            Some(ty) => quote!(#ty),
            None => quote!(f64),
        };
        let ident = &input.ident;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        quote! {
            #[automatically_derived]
            impl #impl_g #p::RankHistogram for #ident #ty_g #where_g {
                type Board = #board_ty;
                type Score = #score_ty;
                const RANK: #p::RankSpec = #p::RankSpec::FALLBACK;
                fn board(&self) -> &Self::Board {
                    #board_ref
                }
                fn score(&self) -> Self::Score {
                    #p::core::default::Default::default()
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn parsed(input: DeriveInput) -> Result<Option<Spec>, Vec<String>> {
        let (r, e) = crate::ctxt::collect(|cx| {
            let collection = input.ident.to_string().to_lowercase();
            Input::from_syn(cx, &input).and_then(|m| parse(cx, &input, &m, &collection)?.spec)
        });
        if e.is_empty() {
            Ok(r)
        } else {
            Err(e)
        }
    }

    #[test]
    fn explicit_form_resolves_through_serde() {
        let r = parsed(parse_quote! {
            #[serde(rename_all = "camelCase")]
            #[model(collection = "scores")]
            #[rank_histogram(board = "exam_id", score = "score", order = "asc", precision = 0.5, layout = "documents", histogram = "exam_ranks")]
            struct S { student_id: String, exam_id: String, score: f64 }
        })
        .unwrap()
        .unwrap();
        assert_eq!(r.board.0, "examId");
        assert_eq!(r.score.0, "score");
        assert!(r.order == Order::Asc && r.layout == Layout::Documents);
        assert_eq!(r.precision, Some(0.5));
        assert_eq!(r.histogram, "exam_ranks");
    }

    #[test]
    fn bare_form_infers_when_unambiguous() {
        let r = parsed(parse_quote! {
            #[rank_histogram]
            struct Result {
                #[serde(rename = "_id")] id: ObjectId,
                exam: String,
                points: i32,
                #[serde(skip)] cached: u64,
            }
        })
        .unwrap()
        .unwrap();
        assert_eq!((r.board.0.as_str(), r.score.0.as_str()), ("exam", "points"));
        assert!(r.order == Order::Desc && r.layout == Layout::Array && r.precision.is_none());
        assert_eq!(r.histogram, "result_ranks");
    }

    #[test]
    fn ambiguity_lists_candidates() {
        let e = parsed(parse_quote! {
            #[rank_histogram]
            struct S { student: String, exam: String, score: f64 }
        })
        .err()
        .unwrap();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("`student`, `exam`"), "{e:?}");
        // Naming the board settles it.
        assert!(parsed(parse_quote! {
            #[rank_histogram(board = "exam")]
            struct S { student: String, exam: String, score: f64 }
        })
        .is_ok());
    }

    #[test]
    fn an_unresolved_option_adds_no_inference_error() {
        let one = |input: DeriveInput| {
            let e = parsed(input).err().unwrap();
            assert_eq!(e.len(), 1, "{e:?}");
            e[0].clone()
        };
        // The integers could be the board only if they were not the score.
        let e = one(parse_quote! {
            #[rank_histogram]
            struct S { exam: String, points: i32, attempts: i32 }
        });
        assert!(e.contains("infer the score: `points`, `attempts`"), "{e}");
        let e = one(parse_quote! {
            #[rank_histogram(score = "pionts")]
            struct S { exam: String, points: i32 }
        });
        assert!(e.contains("did you mean `points`"), "{e}");
        let e = one(parse_quote! {
            #[rank_histogram(board = "seasn")]
            struct S { season: i32, points: i32 }
        });
        assert!(e.contains("did you mean `season`"), "{e}");
        // An ambiguity that stands whatever the score is still is reported.
        let e = parsed(parse_quote! {
            #[rank_histogram]
            struct S { student: String, exam: String, points: i32, bonus: f64 }
        })
        .err()
        .unwrap();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e[1].contains("infer the board: `student`, `exam` could"),
            "{e:?}"
        );
        // No candidate at all, with the score's field named.
        let e = one(parse_quote! {
            #[rank_histogram]
            struct S { tags: Vec<String>, points: i32 }
        });
        assert!(
            e.contains("no String, integer, ObjectId or Uuid field besides the score `points`"),
            "{e}"
        );
    }

    #[test]
    fn precision_values() {
        let p = |e: Expr| precision_value(&e);
        assert_eq!(p(parse_quote!(0.5)), Ok(0.5));
        assert_eq!(p(parse_quote!(2)), Ok(2.0));
        assert!(p(parse_quote!(0)).unwrap_err().contains("above 0"));
        assert!(p(parse_quote!(-0.5)).unwrap_err().contains("above 0"));
        assert!(p(parse_quote!("0.5"))
            .unwrap_err()
            .contains("number literal"));
        assert!(p(parse_quote!(1e-20)).unwrap_err().contains("1e-12"));
    }
}
