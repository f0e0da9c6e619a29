"""Common English words for synthetic prompts. Each is one token, with its leading space, in
SmolLM2's vocabulary (and nearly all are in other English BPE vocabularies), so a prompt of n
words is about n tokens."""

_TEXT = """
the of and to in is that for it as was with be by on not he this are or his from at which but
have an they you were her she there been one all we their has would when if so no what up out
who them some could him into its then two more these time about other than only new first also
after any may way made now like over such our man even most me state did many before must
through back years where much your well down should because each just those people how too
little good very make world still own see men work long here get both between life being under
never day same another know while last might great old year off come since against go came
right used take three states himself few house use during without again place around however
home small found thought went say part once general high upon school every does got united left
number course war until always away something fact though water less public put think almost
hand enough far took head yet government system better set told nothing night end why called
find going look asked later point knew city next program business give group toward young days
let room president side social given present order national possible rather second face per
among form important often things looked early white case become large big need four within
felt along children saw best church ever least power development light thing seemed family
interest want members mind country area others done turned although open god service certain
kind problem began different door thus help sense means whole matter perhaps itself times law
human line above name example action company hands local show five history whether gave either
act feet across taken past quite anything seen having death week experience body word half
field car words already themselves information tell together college shall money period held
keep sure real probably free seems political cannot behind miss question air office making
brought whose special heard major problems ago became federal moment study available known
result street economic boy position reason change south board individual job society west close
turn love community true court force full seem
"""
WORDS: tuple[str, ...] = tuple(_TEXT.split())
